//! A complete stream folded back into the whole answer it carried: what
//! the response cache serves a plain request from an entry a streamed one
//! stored (and what it reads a streamed entry's usage from).
//!
//! The stream is parsed and decoded as a translated stream is
//! ([`SseParser`], [`Decoder`]), and its events are folded in order: text
//! and reasoning fragments join the part they continue (a new part starts
//! after a block ends or when the kind changes), a tool call gathers its
//! argument fragments by its key, the usage is the last snapshot, the stop
//! reason the last said. A stream that failed, was cut, or has no end is
//! refused: only a whole answer is ever rebuilt.

use std::collections::HashMap;

use super::{Decoder, Event, StreamOptions};
use crate::sse::{SseFrame, SseParser};
use crate::{Answer, Dialect, DialectError, Part, StopReason, Usage};

/// The whole answer `bytes` (a complete stream of `dialect`) carried.
pub fn collect_answer(dialect: Dialect, bytes: &[u8]) -> Result<Answer, DialectError> {
    let opts = StreamOptions::default();
    let mut parser = SseParser::new(opts.max_event_bytes);
    let mut decoder = Decoder::new(dialect, &opts);
    let mut frames: Vec<SseFrame> = Vec::new();
    parser.push(bytes, &mut frames)?;
    let mut events = Vec::new();
    for frame in &frames {
        decoder.decode(frame, &mut events);
    }
    decoder.finish(parser.has_partial(), &mut events);
    fold(events)
}

/// Folds decoded events into the answer.
fn fold(events: Vec<Event>) -> Result<Answer, DialectError> {
    let mut answer = Answer {
        id: String::new(),
        model: String::new(),
        content: Vec::new(),
        stop_reason: StopReason::EndTurn,
        stop_sequence: None,
        usage: Usage::default(),
    };
    // Whether the last part may still grow (no block end since).
    let mut open = false;
    let mut tools: HashMap<u64, usize> = HashMap::new();
    let mut ended = false;
    for ev in events {
        match ev {
            Event::Start { id, model } => {
                answer.id = id;
                answer.model = model;
            }
            Event::Text(t) => match answer.content.last_mut() {
                Some(Part::Text { text, .. }) if open => text.push_str(&t),
                _ => {
                    answer.content.push(Part::text(t));
                    open = true;
                }
            },
            Event::Thinking(t) => match answer.content.last_mut() {
                Some(Part::Thinking { text, .. }) if open => text.push_str(&t),
                _ => {
                    answer.content.push(Part::Thinking {
                        text: t,
                        signature: None,
                    });
                    open = true;
                }
            },
            Event::Signature(s) => {
                if let Some(Part::Thinking { signature, .. }) = answer.content.last_mut() {
                    signature.get_or_insert_with(String::new).push_str(&s);
                }
            }
            Event::RedactedThinking(data) => {
                answer.content.push(Part::RedactedThinking { data });
                open = false;
            }
            Event::ToolStart { key, id, name } => {
                tools.insert(key, answer.content.len());
                answer.content.push(Part::ToolUse {
                    id,
                    name,
                    input: String::new(),
                    signature: None,
                    cache_control: None,
                });
                open = false;
            }
            Event::ToolArgs { key, json } => {
                if let Some(Part::ToolUse { input, .. }) =
                    tools.get(&key).and_then(|i| answer.content.get_mut(*i))
                {
                    input.push_str(&json);
                }
            }
            Event::BlockEnd => open = false,
            Event::Usage(u) => answer.usage = u,
            Event::Stop { reason, sequence } => {
                answer.stop_reason = reason;
                answer.stop_sequence = sequence;
            }
            Event::End => ended = true,
            Event::Failed(f) => {
                return Err(DialectError::invalid(
                    "stream",
                    format!("the stream failed: {}", f.message),
                ))
            }
        }
    }
    if !ended {
        return Err(DialectError::invalid("stream", "the stream has no end"));
    }
    for part in &mut answer.content {
        if let Part::ToolUse { input, .. } = part {
            if input.trim().is_empty() {
                *input = "{}".to_owned();
            }
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> Answer {
        Answer {
            id: "msg_1".into(),
            model: "m".into(),
            content: vec![
                Part::Thinking {
                    text: "let me add".into(),
                    signature: Some("sig".into()),
                },
                Part::text("2+2 is 4."),
                Part::ToolUse {
                    id: "call_1".into(),
                    name: "calc".into(),
                    input: r#"{"a":2,"b":2}"#.into(),
                    signature: None,
                    cache_control: None,
                },
            ],
            stop_reason: StopReason::ToolUse,
            stop_sequence: None,
            usage: Usage {
                input: 12,
                output: 7,
                ..Usage::default()
            },
        }
    }

    /// A whole answer written as a stream and folded back is the same
    /// answer, in each dialect a client streams.
    #[test]
    fn an_answer_written_as_a_stream_folds_back_to_itself() {
        for dialect in [Dialect::Anthropic, Dialect::OpenAi] {
            let mut want = answer();
            if dialect == Dialect::OpenAi {
                // OpenAI's stream has no reasoning signature.
                want.content[0] = Part::Thinking {
                    text: "let me add".into(),
                    signature: None,
                };
            }
            let opts = StreamOptions {
                id: "msg_1".into(),
                model: Some("m".into()),
                include_usage: true,
                ..StreamOptions::default()
            };
            let sse = super::super::answer_stream(&want, dialect, &opts)
                .unwrap_or_else(|e| panic!("{dialect:?}: {e}"));
            let got = collect_answer(dialect, &sse).unwrap_or_else(|e| panic!("{dialect:?}: {e}"));
            assert_eq!(got.content, want.content, "{dialect:?}");
            assert_eq!(got.stop_reason, want.stop_reason, "{dialect:?}");
            assert_eq!(got.usage.output, 7, "{dialect:?}");
        }
    }

    #[test]
    fn a_cut_or_failed_stream_is_refused() {
        let whole =
            super::super::answer_stream(&answer(), Dialect::Anthropic, &StreamOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
        let cut = &whole[..whole.len() / 2];
        assert!(collect_answer(Dialect::Anthropic, cut).is_err());
        let failed = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n";
        assert!(collect_answer(Dialect::Anthropic, failed).is_err());
        assert!(collect_answer(Dialect::OpenAi, b"data: {not json\n\n").is_err());
    }
}
