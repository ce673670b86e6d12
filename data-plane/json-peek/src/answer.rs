//! The answer body: [`peek_answer`] and what it reads.

use crate::error::{PeekError, Result};
use crate::parser::{or_null, Members, Parser};

/// The fields of a JSON answer the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnswerPeek {
    /// `model`.
    pub model: Option<String>,
    /// `usage`.
    pub usage: Option<Usage>,
}

/// Token counts, in the chat (`prompt_`/`completion_`) or responses
/// (`input_`/`output_`) spelling.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// `input_tokens`.
    pub input_tokens: Option<u64>,
    /// `output_tokens`.
    pub output_tokens: Option<u64>,
}

/// Reads `model` and `usage` from a JSON answer, checking that the whole
/// body is one valid JSON object.
pub fn peek_answer(body: &[u8]) -> std::result::Result<AnswerPeek, PeekError> {
    Parser { b: body, i: 0 }.answer()
}

/// The answer fields, in declaration order (the order of the array form).
const ANSWER_FIELDS: &[&str] = &["model", "usage"];
const USAGE_FIELDS: &[&str] = &[
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
];

impl Parser<'_> {
    /// The whole body (as [`Self::request`]).
    #[inline(always)]
    fn answer(mut self) -> Result<AnswerPeek> {
        self.top_level_object()?;
        let mut model = None;
        let mut usage = None;
        let mut members = Members::default();
        while let Some(field) = self.next_field(&mut members, ANSWER_FIELDS)? {
            match field {
                0 => model = or_null!(self, self.string()?.into_owned()),
                _ => usage = or_null!(self, self.usage()?),
            }
        }
        self.end()?;
        Ok(AnswerPeek { model, usage })
    }

    #[inline(always)]
    fn usage(&mut self) -> Result<Usage> {
        let mut out = Usage::default();
        if self.nested("struct Usage")? {
            let mut members = Members::default();
            while let Some(field) = self.next_field(&mut members, USAGE_FIELDS)? {
                self.usage_field(&mut out, field)?;
            }
        } else {
            self.i = self.array_fields(USAGE_FIELDS.len(), |p, field| {
                p.usage_field(&mut out, field)
            })?;
        }
        Ok(out)
    }

    /// The value of one field of [`Usage`].
    #[inline(always)]
    fn usage_field(&mut self, out: &mut Usage, field: usize) -> Result<()> {
        let n = or_null!(self, self.unsigned()?);
        match field {
            0 => out.prompt_tokens = n,
            1 => out.completion_tokens = n,
            2 => out.input_tokens = n,
            _ => out.output_tokens = n,
        }
        Ok(())
    }
}
