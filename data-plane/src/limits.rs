//! The proxy's own caps: request bytes buffered at once by all requests
//! together, client connections open at once (in all and per peer), and
//! the bytes of a request head a connection may buffer.
//!
//! Each request's body is read whole (it may be sent to several pools), so
//! without a global cap a burst of large bodies takes as much memory as
//! clients send: 64 clients with 30 MiB each are 1.9 GiB, past the shipped
//! pod's 1 GiB limit. With it, a request that would go past the cap is
//! answered `503 overloaded` with `Retry-After` at once, and the proxy's
//! memory stays bounded by the cap plus a per-connection constant.
//!
//! - [`ByteBudget`]: a counter of bytes reserved; a [`Reservation`] holds
//!   its bytes until dropped (when the request is done with its body). A
//!   body with a `Content-Length` reserves it before the first byte is read;
//!   a chunked body grows its reservation as frames arrive.
//! - [`ConnectionSlots`]: a counter of open connections, and one per peer
//!   (an IPv4 address or an IPv6 /64, [`peer_key`]); a [`ConnectionSlot`]
//!   is held for as long as its connection is served. Past the cap, a
//!   connection gets a canned `503 overloaded` and is closed
//!   ([`OVERLOADED_ANSWER`]); past its peer's cap, the same with a message
//!   that says so ([`PEER_OVERLOADED_ANSWER`]). Without the per-peer cap,
//!   one peer could open every slot and hold it, sending nothing, until
//!   the header timeout.
//! - [`HeadMeter`] and [`Metered`]: the bytes of an unfinished request
//!   head. hyper keeps a connection's unparsed bytes in its read buffer, up
//!   to `CUSTOM_ROUTER_MAX_HEADER_BYTES` (64 KiB; past it, `431`); before
//!   that cap, 4,000 connections each sending 410 KB of header and no
//!   blank line took the proxy from 22 MiB to 1.1-2.1 GiB. Each
//!   connection's first [`FREE_HEAD_BYTES`] of head are part of its fixed
//!   cost (hyper's first read buffer is that large anyway); bytes beyond
//!   are reserved out of the same [`ByteBudget`] as request bodies, as
//!   they arrive, and given back when the head is complete (the body then
//!   reserves its own). A head that does not fit gets a canned
//!   `503 overloaded` and its connection is closed. So unfinished heads,
//!   like bodies, stay within `CUSTOM_ROUTER_MAX_BUFFERED_BYTES` plus a
//!   per-connection constant, and ordinary requests, whose heads are
//!   smaller, never touch the shared counter.
//!
//!   An HTTP/2 connection (ALPN `h2`, or a plaintext one that opens with
//!   the HTTP/2 preface) is not metered: its requests' heads arrive
//!   interleaved on one connection, and hyper bounds them itself (a
//!   header list past `CUSTOM_ROUTER_MAX_HEADER_BYTES` is answered `431`
//!   on its stream); request body bytes not yet read stay within
//!   flow-control windows of 64 KiB a connection, and answer bytes queued
//!   for a slow reader within a share per stream of 64 KiB (4 KiB a
//!   stream at least).
//!   Heads of requests in flight are not counted in the byte budget (as
//!   on HTTP/1.1); their number is the stream cap times the connections.
//!
//! The byte and connection counters are lock-free: one atomic add (and one
//! subtract) per request or connection; the per-peer counts are a map
//! under a lock, taken once when a connection opens and once when it
//! closes, with an entry only for peers that have a connection open.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes reserved out of a fixed cap, shared by every request.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    cap: usize,
}

impl ByteBudget {
    /// A budget of `cap` bytes.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            cap,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, to be grown.
    pub(crate) fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            held: 0,
        }
    }

    /// Takes `n` more bytes if that stays within the cap.
    fn take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(n).filter(|t| *t <= self.cap) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }
}

/// Bytes held out of a [`ByteBudget`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<ByteBudget>,
    held: usize,
}

impl Reservation {
    /// Grows the reservation to at least `total` bytes; false (and
    /// unchanged) when the budget cannot give them.
    pub(crate) fn grow_to(&mut self, total: usize) -> bool {
        if total <= self.held {
            return true;
        }
        let more = total - self.held;
        if self.budget.take(more) {
            self.held = total;
            true
        } else {
            false
        }
    }
}

impl Reservation {
    /// Gives every byte back (the reservation stays, empty, to be grown
    /// again).
    pub(crate) fn release(&mut self) {
        if self.held > 0 {
            self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
            self.held = 0;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.held > 0 {
            self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
        }
    }
}

/// Open client connections, up to a cap in all and a cap per peer.
#[derive(Debug)]
pub(crate) struct ConnectionSlots {
    open: AtomicUsize,
    cap: usize,
    per_peer_cap: usize,
    /// Open connections by [`peer_key`]; an entry only while it has one
    /// (so at most `cap` entries).
    peers: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a connection was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every slot is taken.
    Full,
    /// Its peer holds its share already.
    PeerFull,
}

impl Refused {
    /// The canned answer for it.
    pub(crate) fn answer(self) -> &'static [u8] {
        match self {
            Self::Full => OVERLOADED_ANSWER,
            Self::PeerFull => PEER_OVERLOADED_ANSWER,
        }
    }
}

/// Whom a connection from `ip` counts against: the IPv4 address (an
/// IPv4-mapped IPv6 address is its IPv4 one), or the IPv6 /64 (one host's
/// usual share: counting single IPv6 addresses would let a host take the
/// slots with addresses from its own /64).
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl ConnectionSlots {
    /// At most `cap` connections, `per_peer_cap` of them from one peer.
    pub(crate) fn new(cap: usize, per_peer_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            cap,
            per_peer_cap,
            peers: Mutex::new(HashMap::new()),
        })
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection from `peer`; refused past the cap or
    /// past the peer's.
    pub(crate) fn try_open(self: &Arc<Self>, peer: IpAddr) -> Result<ConnectionSlot, Refused> {
        let previous = self.open.fetch_add(1, Ordering::AcqRel);
        if previous >= self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Full);
        }
        let key = peer_key(peer);
        {
            let mut peers = self.peers();
            let held = peers.entry(key).or_insert(0);
            if *held >= self.per_peer_cap {
                if *held == 0 {
                    peers.remove(&key);
                }
                drop(peers);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(Refused::PeerFull);
            }
            *held += 1;
        }
        Ok(ConnectionSlot {
            slots: Arc::clone(self),
            peer: key,
        })
    }

    /// Connections open from `peer` now.
    #[cfg(test)]
    fn open_from(&self, peer: IpAddr) -> usize {
        self.peers().get(&peer_key(peer)).copied().unwrap_or(0)
    }
}

/// One open connection's place under the caps, given back when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    slots: Arc<ConnectionSlots>,
    peer: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        {
            let mut peers = self.slots.peers();
            if let Some(held) = peers.get_mut(&self.peer) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    peers.remove(&self.peer);
                }
            }
        }
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Head bytes a connection holds without reserving them: hyper's first
/// read buffer is this large anyway, and a usual request head is far
/// smaller.
pub(crate) const FREE_HEAD_BYTES: usize = 8 * 1024;

/// One connection's unfinished request head, counted (see the module
/// docs): the bytes read since the last head was complete, up to
/// `cap` (hyper answers `431` past it), beyond [`FREE_HEAD_BYTES`]
/// reserved out of the shared [`ByteBudget`].
#[derive(Debug)]
pub(crate) struct HeadMeter {
    /// Bytes read now belong to a head (from the start, and from the end
    /// of each request's handling to the next head).
    reading_head: AtomicBool,
    /// Head bytes read so far.
    counted: AtomicUsize,
    /// The most counted for one head.
    cap: usize,
    /// The bytes beyond [`FREE_HEAD_BYTES`].
    reserved: Mutex<Reservation>,
    /// A request's head has been complete at least once.
    any_head: AtomicBool,
}

impl HeadMeter {
    /// A meter for a new connection, reserving out of `budget`, counting
    /// up to `cap` bytes of one head.
    pub(crate) fn new(budget: &Arc<ByteBudget>, cap: usize) -> Arc<Self> {
        Arc::new(Self {
            reading_head: AtomicBool::new(true),
            counted: AtomicUsize::new(0),
            cap,
            reserved: Mutex::new(budget.reservation()),
            any_head: AtomicBool::new(false),
        })
    }

    fn reserved(&self) -> std::sync::MutexGuard<'_, Reservation> {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `n` bytes just read; false when they belong to a head that
    /// no longer fits in the budget.
    fn read(&self, n: usize) -> bool {
        if !self.reading_head.load(Ordering::Acquire) {
            return true;
        }
        let counted = self
            .counted
            .load(Ordering::Acquire)
            .saturating_add(n)
            .min(self.cap);
        self.counted.store(counted, Ordering::Release);
        if counted <= FREE_HEAD_BYTES {
            return true;
        }
        self.reserved().grow_to(counted - FREE_HEAD_BYTES)
    }

    /// The head is complete (the request is being handled): its bytes are
    /// given back; bytes read from now on are the body's.
    pub(crate) fn head_done(&self) {
        self.any_head.store(true, Ordering::Relaxed);
        self.reading_head.store(false, Ordering::Release);
        if self.counted.swap(0, Ordering::AcqRel) > FREE_HEAD_BYTES {
            self.reserved().release();
        }
    }

    /// Whether a request's head has been complete on this connection.
    pub(crate) fn any_head(&self) -> bool {
        self.any_head.load(Ordering::Relaxed)
    }

    /// The request has been handled: bytes read from now on belong to the
    /// next head. (Body bytes the handler left unread, which hyper may read
    /// after its answer, are counted as head bytes then: at most the cap,
    /// until the next head is complete or the connection closes.)
    pub(crate) fn expect_head(&self) {
        self.reading_head.store(true, Ordering::Release);
    }

    /// Bytes counted for the head being read.
    #[cfg(test)]
    fn counted(&self) -> usize {
        self.counted.load(Ordering::Acquire)
    }
}

/// The HTTP version a connection speaks, as far as the listener knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// Plaintext: HTTP/2 if the first bytes are its preface, else HTTP/1.1.
    Sniff,
    /// HTTP/1.1 (TLS with ALPN `http/1.1` or none).
    Http1,
    /// HTTP/2 (TLS with ALPN `h2`).
    Http2,
}

/// The start of the HTTP/2 client preface (`PRI * HTTP/2.0`): no HTTP/1.1
/// request starts so (there is no method `PRI`).
const H2_PREFACE_START: &[u8] = b"PRI ";

/// A client connection whose reads go through a [`HeadMeter`] (HTTP/1.1
/// only: see the module docs). When a head no longer fits, it writes
/// [`OVERLOADED_ANSWER`] (best effort: the client is sending, not reading,
/// so the socket's buffer has room) and reads as closed from then on, so
/// hyper drops the connection.
#[derive(Debug)]
pub(crate) struct Metered<S> {
    stream: S,
    meter: Arc<HeadMeter>,
    refused: bool,
    /// What is known of the version: `Sniff` until the first bytes tell.
    version: Version,
    /// Bytes of [`H2_PREFACE_START`] matched so far (while sniffing).
    matched: usize,
}

impl<S> Metered<S> {
    /// `stream`, counted by `meter` unless it speaks HTTP/2.
    pub(crate) fn new(stream: S, meter: Arc<HeadMeter>, version: Version) -> Self {
        Self {
            stream,
            meter,
            refused: false,
            version,
            matched: 0,
        }
    }

    /// Reads the first bytes of a plaintext connection for the preface.
    fn sniff(&mut self, bytes: &[u8]) {
        if self.version != Version::Sniff {
            return;
        }
        let want = H2_PREFACE_START.get(self.matched..).unwrap_or_default();
        let n = want.len().min(bytes.len());
        if want.get(..n) != bytes.get(..n) {
            self.version = Version::Http1;
        } else if self.matched + n == H2_PREFACE_START.len() {
            self.version = Version::Http2;
        } else {
            self.matched += n;
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        let n = buf.filled().len().saturating_sub(before);
        if n == 0 || this.version == Version::Http2 {
            return Poll::Ready(Ok(()));
        }
        this.sniff(buf.filled().get(before..).unwrap_or_default());
        if this.version != Version::Http2 && !this.meter.read(n) {
            this.refused = true;
            // Best effort, as the answer is.
            let _ = Pin::new(&mut this.stream).poll_write(cx, OVERLOADED_ANSWER);
            buf.set_filled(before);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// What a connection past the cap gets before it is closed.
pub(crate) const OVERLOADED_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 143\r\n\
\r\n\
{\"error\":{\"message\":\"the router is at its limit of open connections; retry shortly\",\"type\":\"overloaded\",\"code\":\"overloaded\",\"request_id\":null}}";

/// What a connection past its peer's cap gets before it is closed.
pub(crate) const PEER_OVERLOADED_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 162\r\n\
\r\n\
{\"error\":{\"message\":\"this address has as many connections open as one address may hold; retry shortly\",\"type\":\"overloaded\",\"code\":\"overloaded\",\"request_id\":null}}";

#[cfg(test)]
mod tests {
    use super::*;

    /// The canned answers are written ahead (no allocation past the cap),
    /// and say what the one envelope writer would.
    #[test]
    fn the_canned_answers_are_the_envelope_writers() {
        for (answer, message) in [
            (
                OVERLOADED_ANSWER,
                "the router is at its limit of open connections; retry shortly",
            ),
            (
                PEER_OVERLOADED_ANSWER,
                "this address has as many connections open as one address may hold; retry shortly",
            ),
        ] {
            let text = std::str::from_utf8(answer).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.ends_with(&format!("\r\ncontent-length: {}", body.len())),
                "{head}"
            );
            let mut want =
                router_dialect::errors::openai_envelope(message, "overloaded", Some("overloaded"));
            want["error"]["request_id"] = serde_json::Value::Null;
            let got: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn reservations_stay_within_the_cap_and_give_back_on_drop() {
        let b = ByteBudget::new(100);
        let mut a = b.reservation();
        assert!(a.grow_to(60));
        let mut c = b.reservation();
        assert!(!c.grow_to(41), "60 + 41 > 100");
        assert!(c.grow_to(40));
        assert_eq!(b.used(), 100);
        // Growing to what is held already takes nothing.
        assert!(a.grow_to(60));
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(c.grow_to(100));
        drop(c);
        assert_eq!(b.used(), 0);
        // Overflow is a refusal, not a wrap.
        assert!(!b.reservation().grow_to(usize::MAX));
        assert_eq!(b.used(), 0);
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn connection_slots_stop_at_the_cap() {
        let s = ConnectionSlots::new(2, 2);
        let one = s.try_open(A);
        let two = s.try_open(B);
        assert!(one.is_ok() && two.is_ok());
        assert_eq!(s.try_open(A).unwrap_err(), Refused::Full);
        drop(one);
        assert!(s.try_open(A).is_ok());
    }

    /// Issue 28, item 2: one peer holds at most its share; the others
    /// still get slots; a closed connection gives its peer's place back,
    /// and a peer with none open leaves no entry behind.
    #[test]
    fn one_peer_cannot_hold_every_slot() {
        let s = ConnectionSlots::new(10, 3);
        let held: Vec<_> = (0..3).map(|_| s.try_open(A).unwrap()).collect();
        assert_eq!(s.try_open(A).unwrap_err(), Refused::PeerFull);
        // A refusal takes no slot.
        assert_eq!(s.open.load(Ordering::Acquire), 3);
        let b = s.try_open(B).unwrap();
        drop(held);
        assert_eq!(s.open_from(A), 0);
        assert_eq!(s.peers().len(), 1, "only B's entry left");
        assert!(s.try_open(A).is_ok());
        drop(b);
        assert!(s.peers().is_empty());
        // The same peer under another spelling: IPv4-mapped IPv6, or
        // another address of the same IPv6 /64.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(peer_key(mapped), A);
        let h1: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let h2: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let s = ConnectionSlots::new(10, 1);
        let _one = s.try_open(h1).unwrap();
        assert_eq!(s.try_open(h2).unwrap_err(), Refused::PeerFull);
        assert!(s.try_open(other).is_ok());
    }

    /// Issue 28, item 2: a head's bytes beyond the free part are reserved
    /// as they arrive, up to the cap; refused when the budget is spent;
    /// given back when the head is complete; body bytes are not counted.
    #[test]
    fn unfinished_heads_are_counted_in_the_byte_budget() {
        let budget = ByteBudget::new(100 * 1024);
        let cap = 64 * 1024;
        let a = HeadMeter::new(&budget, cap);
        // A usual head: nothing reserved.
        assert!(a.read(2_000));
        assert_eq!(budget.used(), 0);
        a.head_done();
        // Its body: not counted.
        assert!(a.read(1 << 20));
        assert_eq!((a.counted(), budget.used()), (0, 0));
        a.expect_head();
        // A head growing past the free part: reserved as it grows, counted
        // up to the cap (hyper answers 431 there).
        assert!(a.read(FREE_HEAD_BYTES + 1_000));
        assert_eq!(budget.used(), 1_000);
        assert!(a.read(1 << 20));
        assert_eq!(budget.used(), cap - FREE_HEAD_BYTES);
        // A second connection's head does not fit beside it.
        let b = HeadMeter::new(&budget, cap);
        assert!(b.read(FREE_HEAD_BYTES + 40 * 1024));
        assert!(!b.read(10 * 1024), "past the budget");
        // The first head completes: its bytes come back.
        a.head_done();
        assert_eq!(budget.used(), 40 * 1024);
        assert!(b.read(10 * 1024));
        drop(b);
        assert_eq!(budget.used(), 0, "a closed connection gives its bytes back");
    }

    /// Issue 30, item 11: a plaintext connection that opens with the
    /// HTTP/2 preface is told apart from HTTP/1.1 by its first bytes,
    /// however they are split across reads.
    #[test]
    fn the_http2_preface_is_told_apart_from_http1() {
        let budget = ByteBudget::new(1 << 20);
        let sniffed = |reads: &[&[u8]]| {
            let mut m = Metered::new((), HeadMeter::new(&budget, 65536), Version::Sniff);
            for r in reads {
                m.sniff(r);
            }
            m.version
        };
        assert_eq!(
            sniffed(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]),
            Version::Http2
        );
        assert_eq!(sniffed(&[b"PR", b"I * HTTP/2.0"]), Version::Http2);
        assert_eq!(
            sniffed(&[b"POST /v1/chat/completions HTTP/1.1\r\n"]),
            Version::Http1
        );
        assert_eq!(sniffed(&[b"P", b"UT / HTTP/1.1"]), Version::Http1);
        assert_eq!(sniffed(&[b"PRI"]), Version::Sniff, "not told yet");
        // A known version is not sniffed again.
        let mut m = Metered::new((), HeadMeter::new(&budget, 65536), Version::Http1);
        m.sniff(b"PRI * HTTP/2.0");
        assert_eq!(m.version, Version::Http1);
    }

    #[test]
    fn the_canned_answers_are_complete_http_responses() {
        for answer in [OVERLOADED_ANSWER, PEER_OVERLOADED_ANSWER] {
            let text = std::str::from_utf8(answer).unwrap_or_default();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
            assert!(head.starts_with("HTTP/1.1 503 "));
            assert!(head.contains(&format!("content-length: {}", body.len())));
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            assert_eq!(v["error"]["type"], "overloaded");
        }
    }
}
