//! What a store keeps for a key, and its bytes in a shared store.
//!
//! One value per key, so that a claim is one `SET NX` and a settle one
//! compare-and-set script:
//!
//! ```text
//! "RI1" state(1) owner(32 hex) fingerprint(32 hex) payload
//! state: F in flight | C completed | N not replayable | U outcome unknown
//! C: {"status":200,"headers":[[name,value],...],"stream":false}\n body
//! N: the first request's id        U: the first request's route record (JSON)
//! ```
//!
//! The owner and state sit at fixed offsets so that the settle script
//! (see the crate's `redis` module) checks them with `string.sub`, without parsing.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use router_policy::idempotency::Stored;

/// Who claimed a key: random per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner(pub [u8; 16]);

/// The request a key was claimed for: SHA-256 (first 16 bytes) of its
/// method, path, body and a hash of the caller's credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 16]);

impl Owner {
    /// A fresh random owner.
    pub fn random() -> Self {
        Self(router_endpoints::random::bytes())
    }
}

/// The fingerprint of a request. The credential (the `Authorization`,
/// `x-api-key` or `api-key` header) is hashed on its own first and only
/// its hash enters the fingerprint: it is never stored.
pub fn fingerprint(method: &str, path: &str, body: &[u8], headers: &HeaderMap) -> Fingerprint {
    use ring::digest::{Context, SHA256};
    let mut cred = Context::new(&SHA256);
    for name in ["authorization", "x-api-key", "api-key"] {
        for v in headers.get_all(name) {
            cred.update(name.as_bytes());
            cred.update(b"\0");
            cred.update(v.as_bytes());
            cred.update(b"\0");
        }
    }
    let cred = cred.finish();
    let mut c = Context::new(&SHA256);
    c.update(method.as_bytes());
    c.update(b"\0");
    c.update(path.as_bytes());
    c.update(b"\0");
    c.update(&(body.len() as u64).to_be_bytes());
    c.update(body);
    c.update(cred.as_ref());
    let d = c.finish();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d.as_ref()[..16]);
    Fingerprint(out)
}

/// An answer kept for replay.
///
/// It owns exactly its own bytes: [`StoredAnswer::keep`] copies the body
/// and every header value out of the buffers they arrived in. A body
/// hyper reads is a slice of the connection's read buffer (8 KiB and up)
/// and a parsed header value a slice of the same buffer; kept as they
/// were, each stored ~300-byte answer held that whole buffer alive, plus
/// a full `HeaderMap` (issue #22: 18 KB per entry, 200 MB for the
/// default 10,000 keys). Only the headers a replay sends are kept, in a
/// list of exactly their number.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAnswer {
    /// Status.
    pub status: StatusCode,
    /// The end-to-end headers a replay sends (not the ones every answer
    /// gets anew: see `NOT_KEPT`).
    pub headers: Box<[(HeaderName, HeaderValue)]>,
    /// Body: the whole answer, or a stream's SSE frames together.
    pub body: Bytes,
    /// Streamed (replayed with the same content type, as one stream).
    pub stream: bool,
}

/// Headers a stored answer does not keep: the router stamps them anew on
/// every answer, a replay included.
pub(crate) const NOT_KEPT: [&str; 6] = [
    "x-request-id",
    "x-router-attempts",
    "x-router-config-version",
    "x-router-cache",
    "age",
    CACHE_STORED_AT,
];

/// The header a cache entry keeps its store time in (Unix milliseconds):
/// never sent to a client (a hit sends `Age` instead).
pub const CACHE_STORED_AT: &str = "x-router-cache-stored-at";

impl StoredAnswer {
    /// This answer stamped as stored at `unix_ms` (a cache entry).
    pub fn stored_at(mut self, unix_ms: i64) -> Self {
        let mut headers: Vec<(HeaderName, HeaderValue)> = std::mem::take(&mut self.headers)
            .into_vec()
            .into_iter()
            .filter(|(k, _)| k.as_str() != CACHE_STORED_AT)
            .collect();
        headers.push((
            HeaderName::from_static(CACHE_STORED_AT),
            HeaderValue::from(unix_ms),
        ));
        self.headers = headers.into_boxed_slice();
        self
    }

    /// When a cache entry was stored (Unix milliseconds), if it says.
    pub fn stored_at_ms(&self) -> Option<i64> {
        self.headers
            .iter()
            .find(|(k, _)| k.as_str() == CACHE_STORED_AT)
            .and_then(|(_, v)| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    }

    /// An answer to keep: `body` and the header values are copied (never
    /// a slice of a larger buffer), headers in `NOT_KEPT` left out.
    pub fn keep(status: StatusCode, headers: &HeaderMap, body: &[u8], stream: bool) -> Self {
        let headers = headers
            .iter()
            .filter(|(k, _)| !NOT_KEPT.contains(&k.as_str()))
            .filter_map(|(k, v)| {
                // Standard names are constants (no allocation); a custom
                // one gets its own copy, as the value does.
                let name = HeaderName::from_bytes(k.as_str().as_bytes()).ok()?;
                let mut value = HeaderValue::from_bytes(v.as_bytes()).ok()?;
                value.set_sensitive(v.is_sensitive());
                Some((name, value))
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Self {
            status,
            headers,
            body: Bytes::copy_from_slice(body),
            stream,
        }
    }

    /// The headers as a map, for a replay.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (k, v) in self
            .headers
            .iter()
            .filter(|(k, _)| k.as_str() != CACHE_STORED_AT)
        {
            map.append(k.clone(), v.clone());
        }
        map
    }

    /// The heap bytes it holds, as the in-process store counts them: the
    /// struct behind its `Arc` (two counters), the header list, each
    /// header's bytes (a name's counted even when it is a constant) and
    /// the body. Exact for what [`StoredAnswer::keep`] builds, since it
    /// owns every byte it points at.
    pub fn heap_bytes(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        std::mem::size_of::<Self>()
            + 2 * std::mem::size_of::<usize>()
            + std::mem::size_of_val(&*self.headers)
            + headers
            + self.body.len()
    }
}

/// The state of a key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyState {
    /// Claimed, not ended.
    InFlight,
    /// Answered; replayable.
    Completed(Arc<StoredAnswer>),
    /// Answered; too large to keep.
    NotReplayable,
    /// May have acted; no answer. The first request's route record (JSON).
    OutcomeUnknown(Bytes),
}

impl KeyState {
    /// The decision's view of it.
    pub fn stored(&self) -> Stored {
        match self {
            Self::InFlight => Stored::InFlight,
            Self::Completed(_) => Stored::Completed,
            Self::NotReplayable => Stored::NotReplayable,
            Self::OutcomeUnknown(_) => Stored::OutcomeUnknown,
        }
    }
}

/// A key's entry: who holds it, for which request, in which state.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The claim's owner (one request).
    pub owner: Owner,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// In flight, or how it ended.
    pub state: KeyState,
}

/// Why stored bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored idempotency record is malformed: {0}")]
pub struct Corrupt(pub &'static str);

const MAGIC: &[u8; 3] = b"RI1";
/// Offset of the payload.
pub(crate) const HEADER_LEN: usize = 3 + 1 + 32 + 32;

fn hex16(out: &mut BytesMut, b: &[u8; 16]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for x in b {
        out.put_u8(HEX[usize::from(x >> 4)]);
        out.put_u8(HEX[usize::from(x & 15)]);
    }
}

fn unhex16(s: &[u8]) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if s.len() != 32 {
        return None;
    }
    for (i, pair) in s.chunks(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16).map(|v| v as u8);
        out[i] = d(pair[0])? << 4 | d(pair[1])?;
    }
    Some(out)
}

/// The owner as the settle script compares it.
pub(crate) fn owner_hex(owner: Owner) -> Bytes {
    let mut b = BytesMut::with_capacity(32);
    hex16(&mut b, &owner.0);
    b.freeze()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AnswerMeta {
    status: u16,
    headers: Vec<(String, String)>,
    stream: bool,
}

/// The entry's bytes.
pub(crate) fn encode(entry: &Entry) -> Bytes {
    let (tag, payload): (u8, Vec<u8>) = match &entry.state {
        KeyState::InFlight => (b'F', Vec::new()),
        KeyState::NotReplayable => (b'N', Vec::new()),
        KeyState::OutcomeUnknown(route) => (b'U', route.to_vec()),
        KeyState::Completed(a) => {
            let meta = AnswerMeta {
                status: a.status.as_u16(),
                headers: a
                    .headers
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                    .collect(),
                stream: a.stream,
            };
            let mut p = serde_json::to_vec(&meta).unwrap_or_default();
            p.push(b'\n');
            p.extend_from_slice(&a.body);
            (b'C', p)
        }
    };
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_slice(MAGIC);
    out.put_u8(tag);
    hex16(&mut out, &entry.owner.0);
    hex16(&mut out, &entry.fingerprint.0);
    out.put_slice(&payload);
    out.freeze()
}

/// Reads an entry's bytes.
pub(crate) fn decode(bytes: &[u8]) -> Result<Entry, Corrupt> {
    if bytes.len() < HEADER_LEN || &bytes[..3] != MAGIC {
        return Err(Corrupt("unknown format"));
    }
    let owner = unhex16(&bytes[4..36]).ok_or(Corrupt("owner"))?;
    let fingerprint = unhex16(&bytes[36..68]).ok_or(Corrupt("fingerprint"))?;
    let payload = &bytes[HEADER_LEN..];
    let state = match bytes[3] {
        b'F' => KeyState::InFlight,
        b'N' => KeyState::NotReplayable,
        b'U' => KeyState::OutcomeUnknown(Bytes::copy_from_slice(payload)),
        b'C' => {
            let nl = payload
                .iter()
                .position(|&b| b == b'\n')
                .ok_or(Corrupt("answer head"))?;
            let meta: AnswerMeta =
                serde_json::from_slice(&payload[..nl]).map_err(|_| Corrupt("answer head"))?;
            let mut headers = Vec::with_capacity(meta.headers.len());
            for (k, v) in meta.headers {
                let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| Corrupt("header"))?;
                let value = HeaderValue::from_str(&v).map_err(|_| Corrupt("header"))?;
                headers.push((name, value));
            }
            let headers = headers.into_boxed_slice();
            KeyState::Completed(Arc::new(StoredAnswer {
                status: StatusCode::from_u16(meta.status).map_err(|_| Corrupt("status"))?,
                headers,
                body: Bytes::copy_from_slice(&payload[nl + 1..]),
                stream: meta.stream,
            }))
        }
        _ => return Err(Corrupt("state")),
    };
    Ok(Entry {
        owner: Owner(owner),
        fingerprint: Fingerprint(fingerprint),
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(state: KeyState) -> Entry {
        Entry {
            owner: Owner([7; 16]),
            fingerprint: Fingerprint([0xa5; 16]),
            state,
        }
    }

    #[test]
    fn every_state_reads_back_as_written() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        for state in [
            KeyState::InFlight,
            KeyState::NotReplayable,
            KeyState::OutcomeUnknown(Bytes::from_static(b"{\"pool\":\"p\"}")),
            KeyState::Completed(Arc::new(StoredAnswer::keep(
                StatusCode::CREATED,
                &headers,
                b"data: 1\n\n\0\xffdata: [DONE]\n\n",
                true,
            ))),
            KeyState::Completed(Arc::new(StoredAnswer {
                status: StatusCode::CREATED,
                headers: Box::new([]),
                body: Bytes::from_static(b"data: 1\n\n\0\xffdata: [DONE]\n\n"),
                stream: true,
            })),
        ] {
            let e = entry(state);
            let bytes = encode(&e);
            assert_eq!(&bytes[4..36], &owner_hex(e.owner)[..]);
            assert_eq!(decode(&bytes), Ok(e));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [&b""[..], b"RI1", b"XX1F", &[b'R'; 80]] {
            assert!(decode(bad).is_err());
        }
        let mut b = encode(&entry(KeyState::InFlight)).to_vec();
        b[3] = b'Z';
        assert_eq!(decode(&b), Err(Corrupt("state")));
    }

    #[test]
    fn the_fingerprint_covers_body_and_credential_but_keeps_no_secret() {
        let h = |auth: &'static str| {
            let mut m = HeaderMap::new();
            m.insert("authorization", HeaderValue::from_static(auth));
            m
        };
        let a = fingerprint("POST", "/v1/x", b"{}", &h("Bearer a"));
        assert_eq!(a, fingerprint("POST", "/v1/x", b"{}", &h("Bearer a")));
        assert_ne!(a, fingerprint("POST", "/v1/x", b"{ }", &h("Bearer a")));
        assert_ne!(a, fingerprint("POST", "/v1/x", b"{}", &h("Bearer b")));
        assert_ne!(a, fingerprint("POST", "/v1/x", b"{}", &HeaderMap::new()));
        let e = encode(&Entry {
            owner: Owner([0; 16]),
            fingerprint: a,
            state: KeyState::InFlight,
        });
        assert!(!e.windows(8).any(|w| w == b"Bearer a"));
    }
}
