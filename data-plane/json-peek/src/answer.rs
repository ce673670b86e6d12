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

/// Token counts, in the chat (`prompt_`/`completion_`), responses or
/// Anthropic (`input_`/`output_`) spelling, with the cache counts of each
/// (OpenAI's `*_tokens_details.cached_tokens`, inside the prompt count;
/// Anthropic's `cache_read_input_tokens` and
/// `cache_creation_input_tokens`, outside it: `router_policy::usage` says
/// how they add up).
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
    /// `prompt_tokens_details`.
    pub prompt_tokens_details: Option<UsageDetails>,
    /// `input_tokens_details`.
    pub input_tokens_details: Option<UsageDetails>,
    /// `cache_read_input_tokens`.
    pub cache_read_input_tokens: Option<u64>,
    /// `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: Option<u64>,
}

/// OpenAI's `prompt_tokens_details` / `input_tokens_details`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageDetails {
    /// `cached_tokens`.
    pub cached_tokens: Option<u64>,
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
    "prompt_tokens_details",
    "input_tokens_details",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
];
const DETAILS_FIELDS: &[&str] = &["cached_tokens"];

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
        if field >= 4 {
            // The cache counts: rarer, out of line.
            return self.cache_field(out, field);
        }
        let n = or_null!(self, self.unsigned()?);
        match field {
            0 => out.prompt_tokens = n,
            1 => out.completion_tokens = n,
            2 => out.input_tokens = n,
            _ => out.output_tokens = n,
        }
        Ok(())
    }

    /// The value of one of [`Usage`]'s cache fields.
    #[inline(never)]
    fn cache_field(&mut self, out: &mut Usage, field: usize) -> Result<()> {
        match field {
            4 => out.prompt_tokens_details = or_null!(self, self.details()?),
            5 => out.input_tokens_details = or_null!(self, self.details()?),
            6 => out.cache_read_input_tokens = or_null!(self, self.unsigned()?),
            _ => out.cache_creation_input_tokens = or_null!(self, self.unsigned()?),
        }
        Ok(())
    }

    /// A `*_tokens_details` object (or its array form).
    fn details(&mut self) -> Result<UsageDetails> {
        let mut out = UsageDetails::default();
        if self.nested("struct UsageDetails")? {
            let mut members = Members::default();
            while self.next_field(&mut members, DETAILS_FIELDS)?.is_some() {
                out.cached_tokens = or_null!(self, self.unsigned()?);
            }
        } else {
            self.i = self.array_fields(DETAILS_FIELDS.len(), |p, _| {
                out.cached_tokens = or_null!(p, p.unsigned()?);
                Ok(())
            })?;
        }
        Ok(out)
    }
}
