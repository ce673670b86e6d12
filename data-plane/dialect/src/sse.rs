//! A server-sent events parser: bytes in, whole events out, at any split
//! point, in bounded memory.
//!
//! It follows the WHATWG `text/event-stream` rules that matter here:
//! lines end with `\r\n`, `\n` or `\r` (a `\r\n` split across two feeds is
//! one line end); `data:` lines of one event are joined with `\n`; a space
//! after the colon is dropped; `:` lines are comments; `event:` names the
//! event; a blank line ends it; an event with no `data:` line is not
//! dispatched; a leading byte-order mark is skipped; `id:` and `retry:`
//! are read and ignored (the router does not reconnect).
//!
//! Memory is bounded: the partial line plus the event's data so far may
//! not exceed the limit ([`DEFAULT_MAX_EVENT_BYTES`], the same 1 MiB the
//! router's OpenAI stream scanner holds). Past it the parser fails with
//! [`DialectError::EventTooLarge`] and stays failed: a backend that never
//! ends a line cannot grow the router's memory. A line that is not UTF-8
//! fails it too.

use crate::DialectError;

/// The largest event the parser holds by default (1 MiB).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseFrame {
    /// Its `event:` name, if it had one.
    pub event: Option<String>,
    /// Its `data:` lines joined with `\n`.
    pub data: String,
}

/// The incremental parser.
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
    after_cr: bool,
    at_start: bool,
    limit: usize,
    failed: bool,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser holding events of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            line: Vec::new(),
            event: None,
            data: String::new(),
            has_data: false,
            after_cr: false,
            at_start: true,
            limit,
            failed: false,
        }
    }

    /// True when bytes of an event not yet ended by a blank line are held
    /// (at the end of the stream, that event was cut).
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.has_data || self.event.is_some()
    }

    /// Feeds bytes; whole events are appended to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseFrame>) -> Result<(), DialectError> {
        if self.failed {
            return Err(DialectError::Unsupported("the event stream already failed"));
        }
        if self.at_start && !bytes.is_empty() {
            // A byte-order mark may only open the stream; it may arrive
            // split, so wait for three bytes (or a mismatch).
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let have = self.line.len();
            let n = (BOM.len() - have).min(bytes.len());
            let mut probe = self.line.clone();
            probe.extend_from_slice(&bytes[..n]);
            if BOM.starts_with(&probe) {
                if probe.len() < BOM.len() {
                    self.line = probe;
                    return Ok(());
                }
                self.line.clear();
                bytes = &bytes[n..];
            }
            self.at_start = false;
        }
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.grow(&bytes[..i])?;
                    self.after_cr = bytes[i] == b'\r';
                    bytes = &bytes[i + 1..];
                    self.end_line(out)?;
                }
                None => {
                    self.grow(bytes)?;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: DialectError) -> Result<(), DialectError> {
        self.failed = true;
        self.line = Vec::new();
        self.data = String::new();
        Err(e)
    }

    fn grow(&mut self, part: &[u8]) -> Result<(), DialectError> {
        if self.line.len() + part.len() + self.data.len() > self.limit {
            return self.fail(DialectError::EventTooLarge { limit: self.limit });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseFrame>) -> Result<(), DialectError> {
        if self.line.is_empty() {
            if self.has_data {
                out.push(SseFrame {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event = None;
            self.data.clear();
            self.has_data = false;
            return Ok(());
        }
        let line = std::mem::take(&mut self.line);
        let Ok(line) = String::from_utf8(line) else {
            return self.fail(DialectError::invalid("event stream", "a line is not UTF-8"));
        };
        if line.starts_with(':') {
            return Ok(());
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        match name {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseFrame> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn events_are_split_on_blank_lines_with_any_line_ending() {
        let frames =
            parse_all(&[b"event: a\r\ndata: 1\r\n\r\ndata: x\ndata:y\n\n: comment\r\rdata: z\r\r"]);
        assert_eq!(
            frames,
            vec![
                SseFrame {
                    event: Some("a".into()),
                    data: "1".into()
                },
                SseFrame {
                    event: None,
                    data: "x\ny".into()
                },
                SseFrame {
                    event: None,
                    data: "z".into()
                },
            ]
        );
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let whole: &[u8] = b"\xEF\xBB\xBFevent: message_start\r\ndata: {\"a\":\"\xC3\xA9\"}\r\n\r\nid: 3\nretry: 10\ndata: [DONE]\n\n";
        let expect = parse_all(&[whole]);
        assert_eq!(expect.len(), 2);
        assert_eq!(expect[0].data, "{\"a\":\"é\"}");
        for i in 0..=whole.len() {
            for j in i..=whole.len() {
                let got = parse_all(&[&whole[..i], &whole[i..j], &whole[j..]]);
                assert_eq!(got, expect, "split at {i}, {j}");
            }
        }
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_a_cut_event_is_partial() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.push(b"event: ping\n\ndata: half", &mut out).unwrap();
        assert!(out.is_empty());
        assert!(p.has_partial());
    }

    #[test]
    fn an_over_long_event_fails_and_stays_failed() {
        let mut p = SseParser::new(16);
        let mut out = Vec::new();
        p.push(b"data: 0123456", &mut out).unwrap();
        let e = p.push(b"789abcdef", &mut out).unwrap_err();
        assert!(matches!(e, DialectError::EventTooLarge { limit: 16 }));
        assert!(p.push(b"\n\n", &mut out).is_err());
        // Data lines count toward the limit too, not only the line.
        let mut p = SseParser::new(16);
        assert!(p
            .push(b"data: 01234567\ndata: 01234567\n", &mut out)
            .is_err());
    }

    #[test]
    fn the_default_limit_is_one_mebibyte() {
        assert_eq!(DEFAULT_MAX_EVENT_BYTES, 1024 * 1024);
        assert_eq!(
            crate::stream::StreamOptions::default().max_event_bytes,
            DEFAULT_MAX_EVENT_BYTES
        );
    }

    #[test]
    fn a_line_that_is_not_utf8_fails() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        assert!(p.push(b"data: \xFF\n\n", &mut out).is_err());
    }
}
