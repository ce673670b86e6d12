//! The request body: [`peek_request`] and what it reads.

use std::borrow::Cow;

use crate::error::{PeekError, Result};
use crate::parser::{or_null, Members, Parser};

/// The fields of an OpenAI-style request body the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestPeek<'a> {
    /// `model`, borrowed from the body unless it had escapes.
    pub model: Option<Cow<'a, str>>,
    /// `stream`.
    pub stream: Option<bool>,
    /// `max_tokens`.
    pub max_tokens: Option<u64>,
    /// `max_completion_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `response_format`.
    pub response_format: Option<ResponseFormatPeek<'a>>,
}

/// The part of `response_format` the router reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResponseFormatPeek<'a> {
    /// `type` (`""` when absent).
    pub kind: Cow<'a, str>,
}

/// Reads the fields the router needs from a request body, checking that the
/// whole body is one valid JSON object.
pub fn peek_request(body: &[u8]) -> std::result::Result<RequestPeek<'_>, PeekError> {
    Parser { b: body, i: 0 }.request()
}

/// The request fields, in declaration order (the order of the array form).
const REQUEST_FIELDS: &[&str] = &[
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "response_format",
];
const RESPONSE_FORMAT_FIELDS: &[&str] = &["type"];

impl<'a> Parser<'a> {
    /// The whole body. (The fields are separate variables until the end,
    /// where the struct is built in place.)
    #[inline(always)]
    fn request(mut self) -> Result<RequestPeek<'a>> {
        self.top_level_object()?;
        let mut model = None;
        let mut stream = None;
        let mut max_tokens = None;
        let mut max_completion_tokens = None;
        let mut max_output_tokens = None;
        let mut response_format = None;
        let mut members = Members::default();
        while let Some(field) = self.next_field(&mut members, REQUEST_FIELDS)? {
            match field {
                0 => model = or_null!(self, self.string()?),
                1 => stream = or_null!(self, self.boolean()?),
                2 => max_tokens = or_null!(self, self.unsigned()?),
                3 => max_completion_tokens = or_null!(self, self.unsigned()?),
                4 => max_output_tokens = or_null!(self, self.unsigned()?),
                _ => response_format = or_null!(self, self.response_format()?),
            }
        }
        self.end()?;
        Ok(RequestPeek {
            model,
            stream,
            max_tokens,
            max_completion_tokens,
            max_output_tokens,
            response_format,
        })
    }

    #[inline(always)]
    fn response_format(&mut self) -> Result<ResponseFormatPeek<'a>> {
        let mut kind = None;
        if self.nested("struct ResponseFormatPeek")? {
            let mut members = Members::default();
            while self
                .next_field(&mut members, RESPONSE_FORMAT_FIELDS)?
                .is_some()
            {
                kind = Some(self.string()?);
            }
        } else {
            self.i = self.array_fields(RESPONSE_FORMAT_FIELDS.len(), |p, _| {
                kind = Some(p.string()?);
                Ok(())
            })?;
        }
        Ok(ResponseFormatPeek {
            kind: kind.unwrap_or_default(),
        })
    }
}
