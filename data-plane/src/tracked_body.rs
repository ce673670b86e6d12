//! A backend's streamed answer on its way to the client, and the request's
//! completion run exactly once when it ends.
//!
//! [`TrackedBody`] passes the answer through frame by frame, so server-sent
//! events reach the client as the backend produces them. It notices the
//! first data frame (the latency sample: time to first byte) and the end of
//! the body, a break, the client going away, or the request's deadline, and
//! then runs the request's [`Completion`] exactly once.
//!
//! # Deadlines and slow readers
//!
//! hyper polls a response body only when it can write what it gets: a
//! client that stops reading fills the socket buffers, and from then on
//! nothing polls the body. A deadline checked inside `poll_frame` would
//! then never fire, and the backend would keep generating into a stalled
//! connection while the lease held its GPU slot. So a stream with a
//! deadline is *relayed*: a task of its own reads the backend and hands
//! each frame over a one-frame channel to the body hyper polls. The task
//! waits on the backend, on the client's side of the channel (gone?) and on
//! the deadline at once; at the deadline it drops the backend's body (the
//! upstream connection closes, the backend stops) and runs the completion
//! (the lease is released), whether or not the client is reading. The
//! client, when it reads again, gets what was relayed, then one SSE `event:
//! error` naming `deadline_exhausted` (or, for other bodies, an aborted
//! answer).
//!
//! A stream without a deadline has nothing to enforce while the client
//! does not read, and is passed through directly, with no task, unless it
//! is watched.
//!
//! # Watched streams
//!
//! A server-sent-event stream, or one with a stall timeout, is relayed
//! with a [`StreamWatch`]:
//!
//! - the events read before the head was passed on (up to the first token,
//!   see `handler::attempt`) go first;
//! - each event is read whole ([`router_policy::stream::SseScanner`]): a
//!   content event and a usage chunk are told to the completion (tokens,
//!   time per output token); a usage chunk the client did not ask for is
//!   not passed on; an error event or a payload that is not JSON ends the
//!   stream with one SSE `event: error` naming `stream_error` (the client
//!   keeps what it got);
//! - no frame from the backend for `stall` cuts the stream with
//!   `stream_stalled`; the timer runs in the task, whether or not the
//!   client reads. A client that reads nothing for that long is cut too
//!   (as gone: the backend is not blamed).
//!
//! # Translated streams
//!
//! A client of another dialect than the pool's (an Anthropic client of an
//! OpenAI-compatible pool, see `handler::dialect`) gets the stream
//! translated as it flows: what the watch passes on goes through the
//! watch's `router_dialect::stream::StreamTranslator`, event by event,
//! and only the client's dialect reaches it (never buffered whole: the
//! translator holds at most one event). The usage and content the watch
//! reads are the pool's, before translation. The end of the upstream's
//! bytes ends the translated answer (`message_delta`, `message_stop`), or,
//! when the upstream had not finished it, fails it with one error event;
//! a broken upstream body and the router's own cuts (deadline, stall, an
//! error inside the stream) are one `event: error` in the client's
//! dialect too, and nothing follows it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use router_dialect::errors::ErrorKind;
use router_dialect::stream::{StreamState, StreamTranslator};
use router_dialect::Dialect;
use router_policy::stream::{RawEvent, SseEvent, SseScanner, StreamUsage};

use crate::forward::BoxError;
use crate::upstream::UpstreamBody;

/// What happens when a proxied answer's body ends.
pub(crate) trait Completion: Send + 'static {
    /// The first data frame arrived (time to first byte).
    fn first_byte(&mut self);
    /// A data frame passed (or, after the client left, was read).
    fn data(&mut self, _bytes: &Bytes) {}
    /// A content event passed (watched streams).
    fn content(&mut self) {}
    /// The stream reported its usage (watched streams).
    fn usage(&mut self, _usage: StreamUsage) {}
    /// The body ended, was cut, or the client went away.
    fn finish(self: Box<Self>, end: BodyEnd);
}

/// How a proxied body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    /// Every byte went to the client.
    Complete,
    /// The backend broke the stream.
    UpstreamError,
    /// The client went away before the end.
    ClientGone,
    /// The request's deadline came first: the stream was cut.
    DeadlineCut,
    /// The client went away, and the backend's answer was read to its
    /// end anyway (a keyed request: the answer is kept for the retry).
    FinishedAfterClientLeft,
    /// The backend reported an error inside the stream, or sent what is
    /// not an event: the stream was cut (`stream_error`).
    StreamError,
    /// The backend sent nothing for the stall timeout: the stream was cut
    /// (`stream_stalled`).
    Stalled,
}

/// What a watched stream is read for (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StreamWatch {
    /// Reads server-sent events (`None`: frames pass as they are).
    pub(crate) scanner: Option<SseScanner>,
    /// What was read before the head was passed on, in order.
    pub(crate) prefix: Vec<RawEvent>,
    /// The backend's body already ended while the prefix was read.
    pub(crate) ended: bool,
    /// Longest silence from the backend after the first token.
    pub(crate) stall: Option<std::time::Duration>,
    /// Usage-only chunks are the router's own request: not passed on.
    pub(crate) strip_usage: bool,
    /// What is passed on is translated to the client's dialect first (see
    /// the module docs; boxed: only translated streams pay for it).
    pub(crate) translate: Option<Box<StreamTranslator>>,
    /// The client's dialect: the router's own cut events are written in it.
    pub(crate) client: Dialect,
}

impl StreamWatch {
    /// Whether this watch needs the relay task.
    fn active(&self) -> bool {
        self.scanner.is_some()
            || self.stall.is_some()
            || !self.prefix.is_empty()
            || self.ended
            || self.translate.is_some()
    }

    /// `data` as the client gets it: translated when the stream is (empty:
    /// nothing to send yet), and whether the translation failed (it then
    /// ended with an error event, in what it gave).
    fn pass(&mut self, data: Bytes) -> (Option<Bytes>, bool) {
        let Some(t) = self.translate.as_mut() else {
            return ((!data.is_empty()).then_some(data), false);
        };
        let mut out = Vec::new();
        t.feed(&data, &mut out);
        let failed = t.state() == StreamState::Failed;
        ((!out.is_empty()).then(|| Bytes::from(out)), failed)
    }

    /// The upstream's bytes ended: what the client still gets (a
    /// translated answer's end, or its error event when the upstream had
    /// not finished it), and whether that is a failure.
    fn finish(&mut self) -> (Option<Bytes>, bool) {
        let Some(t) = self.translate.as_mut() else {
            return (None, false);
        };
        let mut out = Vec::new();
        t.finish(&mut out);
        let failed = t.state() == StreamState::Failed;
        ((!out.is_empty()).then(|| Bytes::from(out)), failed)
    }

    /// The upstream's body broke: a translated stream's error event.
    fn broken(&mut self) -> Option<Bytes> {
        let t = self.translate.as_mut()?;
        let mut out = Vec::new();
        t.fail(
            ErrorKind::UpstreamReset,
            "the backend's stream broke; the answer is incomplete",
            &mut out,
        );
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

/// Why a relayed stream was cut (told to the client when it reads again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Cut {
    Deadline = 1,
    StreamError = 2,
    Stalled = 3,
}

/// Set on a cut's code when the client was told already (a translated
/// stream's own error event): nothing more is sent.
const TOLD: u8 = 0x80;

impl Cut {
    fn from_u8(v: u8) -> Option<Self> {
        match v & !TOLD {
            1 => Some(Self::Deadline),
            2 => Some(Self::StreamError),
            3 => Some(Self::Stalled),
            _ => None,
        }
    }

    fn end(self) -> BodyEnd {
        match self {
            Self::Deadline => BodyEnd::DeadlineCut,
            Self::StreamError => BodyEnd::StreamError,
            Self::Stalled => BodyEnd::Stalled,
        }
    }

    fn event(self) -> &'static str {
        match self {
            Self::Deadline => DEADLINE_EVENT,
            Self::StreamError => STREAM_ERROR_EVENT,
            Self::Stalled => STALLED_EVENT,
        }
    }

    /// The cut's one SSE event in the client's dialect (the same kind and
    /// message as OpenAI's).
    fn event_in(self, client: Dialect) -> Bytes {
        if client == Dialect::OpenAi {
            return Bytes::from_static(self.event().as_bytes());
        }
        let (kind, message) = match self {
            Self::Deadline => (
                ErrorKind::DeadlineExhausted,
                "the request's deadline ran out; the stream was cut",
            ),
            Self::StreamError => (
                ErrorKind::StreamError,
                "the backend reported an error inside the stream; the answer is incomplete",
            ),
            Self::Stalled => (
                ErrorKind::StreamStalled,
                "the backend sent nothing for the stall timeout; the stream was cut",
            ),
        };
        Bytes::from(router_dialect::errors::stream_event(
            client, kind, false, message,
        ))
    }
}

// The three OpenAI events are written ahead, in the order clients have
// seen since they were introduced; `tests::the_cut_events_are_the_envelope_writers`
// holds them to `router_dialect::errors::openai_envelope`.

/// The one SSE event sent when a stream is cut at its deadline.
const DEADLINE_EVENT: &str = "event: error\ndata: {\"error\":{\"type\":\"deadline_exhausted\",\"code\":\"deadline_exhausted\",\"message\":\"the request's deadline ran out; the stream was cut\"}}\n\n";

/// The one SSE event sent when the backend failed inside the stream.
const STREAM_ERROR_EVENT: &str = "event: error\ndata: {\"error\":{\"type\":\"stream_error\",\"code\":\"stream_error\",\"message\":\"the backend reported an error inside the stream; the answer is incomplete\"}}\n\n";

/// The one SSE event sent when the backend went silent.
const STALLED_EVENT: &str = "event: error\ndata: {\"error\":{\"type\":\"stream_stalled\",\"code\":\"stream_stalled\",\"message\":\"the backend sent nothing for the stall timeout; the stream was cut\"}}\n\n";

/// A completion that runs exactly once: at [`Once::finish`], or as
/// `ClientGone` when dropped unfinished (a task or body dropped early).
struct Once {
    completion: Option<Box<dyn Completion>>,
    seen_data: bool,
}

impl Once {
    fn new(completion: Box<dyn Completion>) -> Self {
        Self {
            completion: Some(completion),
            seen_data: false,
        }
    }

    fn frame(&mut self, frame: &Frame<Bytes>) {
        let Some(data) = frame.data_ref() else {
            return;
        };
        if let Some(c) = self.completion.as_mut() {
            if !self.seen_data {
                self.seen_data = true;
                c.first_byte();
            }
            c.data(data);
        }
    }

    fn content(&mut self) {
        if let Some(c) = self.completion.as_mut() {
            c.content();
        }
    }

    fn usage(&mut self, usage: StreamUsage) {
        if let Some(c) = self.completion.as_mut() {
            c.usage(usage);
        }
    }

    fn finish(&mut self, end: BodyEnd) {
        if let Some(mut c) = self.completion.take() {
            if !self.seen_data && end == BodyEnd::Complete {
                // An empty body: its end is the first byte.
                c.first_byte();
            }
            c.finish(end);
        }
    }

    fn finished(&self) -> bool {
        self.completion.is_none()
    }
}

impl Drop for Once {
    fn drop(&mut self) {
        self.finish(BodyEnd::ClientGone);
    }
}

/// A response body passed through frame by frame, with a completion hook
/// and an optional deadline (see the module docs).
pub(crate) struct TrackedBody {
    source: Source,
    sse: bool,
    /// The client's dialect (its cut events are written in it).
    client: Dialect,
}

enum Source {
    /// No deadline: the backend's body itself.
    Direct {
        inner: Option<UpstreamBody>,
        once: Once,
    },
    /// A deadline: frames relayed by a task that enforces it.
    Relayed {
        frames: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
        /// Set by the task when it cut the stream (a [`Cut`]).
        cut: Arc<AtomicU8>,
        /// The cut was told to the client.
        told: bool,
    },
}

impl TrackedBody {
    /// Wraps `inner`; `completion` runs exactly once. With a `deadline`,
    /// or when the answer must be `finished` even if the client leaves
    /// (a keyed request; its caller gives it a deadline too), a relay task
    /// is spawned on the current runtime.
    pub(crate) fn new(
        inner: UpstreamBody,
        completion: Box<dyn Completion>,
        deadline: Option<Instant>,
        sse: bool,
        finish: bool,
        watch: StreamWatch,
    ) -> Self {
        let deadline = match (deadline, finish || watch.active()) {
            (None, true) => Some(crate::clock::later(
                Instant::now(),
                crate::clock::A_YEAR,
                crate::clock::A_YEAR,
            )),
            (d, _) => d,
        };
        let client = watch.client;
        let source = match deadline {
            None => Source::Direct {
                inner: Some(inner),
                once: Once::new(completion),
            },
            Some(deadline) => {
                let (tx, frames) = mpsc::channel(1);
                let cut = Arc::new(AtomicU8::new(0));
                tokio::spawn(relay(
                    inner,
                    Once::new(completion),
                    deadline,
                    tx,
                    Arc::clone(&cut),
                    finish,
                    watch,
                ));
                Source::Relayed {
                    frames,
                    cut,
                    told: false,
                }
            }
        };
        Self {
            source,
            sse,
            client,
        }
    }
}

/// What a relayed frame becomes after the watch has read it.
enum Judged {
    /// Pass these bytes on (possibly none: a stripped usage chunk, or an
    /// event not yet complete).
    Pass(Option<Bytes>),
    /// Cut the stream, after passing these bytes.
    Cut(Option<Bytes>, Cut),
}

/// Reads the events of `chunk` (a watched SSE stream): passes content and
/// every other event on, tells the completion of content and usage,
/// drops a usage-only chunk the router asked for, and cuts at an error.
fn judge_events(
    events: Vec<RawEvent>,
    strip_usage: bool,
    once: &mut Once,
    out: &mut bytes::BytesMut,
) -> Option<Cut> {
    for ev in events {
        match ev.kind {
            SseEvent::Content { usage } => {
                once.content();
                if let Some(u) = usage {
                    once.usage(u);
                }
            }
            SseEvent::Usage { usage, only_usage } => {
                once.usage(usage);
                if strip_usage && only_usage {
                    continue;
                }
            }
            SseEvent::Error { .. } | SseEvent::Malformed => return Some(Cut::StreamError),
            SseEvent::NoContent | SseEvent::Done => {}
        }
        out.extend_from_slice(&ev.bytes);
    }
    None
}

/// Reads one data frame of a watched stream.
fn judge(watch: &mut StreamWatch, once: &mut Once, data: &Bytes) -> Judged {
    let Some(scanner) = watch.scanner.as_mut() else {
        return Judged::Pass(Some(data.clone()));
    };
    let mut events = Vec::new();
    let fed = scanner.feed(data, &mut events);
    let mut out = bytes::BytesMut::new();
    let cut = judge_events(events, watch.strip_usage, once, &mut out);
    let out = (!out.is_empty()).then(|| out.freeze());
    match (cut, fed) {
        (Some(c), _) => Judged::Cut(out, c),
        (None, Err(_)) => Judged::Cut(out, Cut::StreamError),
        (None, Ok(())) => Judged::Pass(out),
    }
}

/// Reads the backend's body into `tx` until it ends, the client's side is
/// dropped, `deadline` comes, or the watch cuts it, whichever is first;
/// runs the completion. With `finish`, a client going away does not stop
/// the reading: the answer is read to its end (still bounded by
/// `deadline`) for the completion to keep.
#[allow(unused_assignments)] // `send!` marks the client gone before a cut
async fn relay(
    mut inner: UpstreamBody,
    mut once: Once,
    deadline: Instant,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    cut: Arc<AtomicU8>,
    finish: bool,
    mut watch: StreamWatch,
) {
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    // The stall timer: re-armed at every frame from the backend.
    let stall_after = watch.stall;
    let far = crate::clock::later(Instant::now(), crate::clock::A_YEAR, crate::clock::A_YEAR);
    let next_stall = |now: Instant| {
        stall_after.map_or(far, |d| crate::clock::later(now, d, crate::clock::A_YEAR))
    };
    let stalled = tokio::time::sleep_until(next_stall(Instant::now()));
    tokio::pin!(stalled);
    let mut gone = false;
    // A translated stream ended with its own error event: a cut then adds
    // none.
    let mut told = false;
    let ended = |gone: bool| {
        if gone {
            BodyEnd::FinishedAfterClientLeft
        } else {
            BodyEnd::Complete
        }
    };
    // Sends one frame (unless the client is gone), or leaves the relay
    // (labelled `$relay`) at the deadline.
    macro_rules! send {
        ($frame:expr, $relay:lifetime) => {
            if !gone {
                let frame = $frame;
                tokio::select! {
                    biased;
                    () = &mut expired => break $relay Cut::Deadline,
                    // A client that reads nothing for the stall timeout.
                    () = &mut stalled, if stall_after.is_some() => {
                        return once.finish(BodyEnd::ClientGone);
                    }
                    sent = tx.send(Ok(frame)) => if sent.is_err() {
                        if !finish {
                            return once.finish(BodyEnd::ClientGone);
                        }
                        gone = true;
                    },
                }
            }
        };
    }
    // Passes `data` on as the client gets it (translated when the stream
    // is); leaves the relay when the translation failed (its error event
    // sent).
    macro_rules! pass {
        ($data:expr, $relay:lifetime) => {{
            let (bytes, failed) = watch.pass($data);
            if let Some(b) = bytes {
                let f = Frame::data(b);
                once.frame(&f);
                send!(f, $relay);
            }
            if failed {
                told = true;
                break $relay Cut::StreamError;
            }
        }};
    }
    // The backend's bytes ended: a translated stream's last events (or
    // its error event, when the backend had not finished), then the end.
    macro_rules! end {
        ($relay:lifetime) => {{
            let (bytes, failed) = watch.finish();
            if let Some(b) = bytes {
                let f = Frame::data(b);
                once.frame(&f);
                send!(f, $relay);
            }
            if failed {
                told = true;
                break $relay Cut::StreamError;
            }
            return once.finish(ended(gone));
        }};
    }
    let prefix = std::mem::take(&mut watch.prefix);
    let why: Cut = 'relay: {
        // What was read before the head was passed on goes first.
        if !prefix.is_empty() {
            let mut out = bytes::BytesMut::new();
            let cut_now = judge_events(prefix, watch.strip_usage, &mut once, &mut out);
            if !out.is_empty() {
                pass!(out.freeze(), 'relay);
            }
            if let Some(c) = cut_now {
                break 'relay c;
            }
        }
        if watch.ended {
            let held = watch.scanner.as_mut().map(SseScanner::take_held);
            if let Some(rest) = held.filter(|b| !b.is_empty()) {
                pass!(rest, 'relay);
            }
            end!('relay);
        }
        loop {
            let frame = tokio::select! {
                biased;
                () = &mut expired => break 'relay Cut::Deadline,
                () = &mut stalled, if stall_after.is_some() => break 'relay Cut::Stalled,
                () = tx.closed(), if !gone => {
                    if finish {
                        gone = true;
                        continue;
                    }
                    return once.finish(BodyEnd::ClientGone);
                }
                f = inner.frame() => f,
            };
            stalled.as_mut().reset(next_stall(Instant::now()));
            match frame {
                None => {
                    // A last event without its blank line passes as it is.
                    let held = watch.scanner.as_mut().map(SseScanner::take_held);
                    if let Some(rest) = held.filter(|b| !b.is_empty()) {
                        pass!(rest, 'relay);
                    }
                    end!('relay);
                }
                Some(Err(e)) => {
                    // A translated stream tells its client in its dialect;
                    // any other body is aborted.
                    let told_in_dialect = watch.broken().map(Frame::data);
                    if let Some(f) = &told_in_dialect {
                        once.frame(f);
                    }
                    once.finish(BodyEnd::UpstreamError);
                    if !gone {
                        let _ = match told_in_dialect {
                            Some(f) => tx.send(Ok(f)).await,
                            None => tx.send(Err(e.into())).await,
                        };
                    }
                    return;
                }
                Some(Ok(f)) => {
                    let end = inner.is_end_stream();
                    match f.into_data() {
                        Ok(data) => match judge(&mut watch, &mut once, &data) {
                            Judged::Pass(None) => {}
                            Judged::Pass(Some(b)) => pass!(b, 'relay),
                            Judged::Cut(passed, c) => {
                                if let Some(b) = passed {
                                    pass!(b, 'relay);
                                }
                                break 'relay c;
                            }
                        },
                        // Trailers: passed on, except into a translated
                        // stream (whose dialect has none).
                        Err(other) => {
                            if watch.translate.is_none() {
                                once.frame(&other);
                                send!(other, 'relay);
                            }
                        }
                    }
                    if end {
                        end!('relay);
                    }
                }
            }
        }
    };
    // A cut: the backend's body goes (its connection closes, the backend
    // stops), the lease is released, and the client learns of the cut
    // when it reads again (unless a translated stream told it already).
    drop(inner);
    cut.store(why as u8 | if told { TOLD } else { 0 }, Ordering::Release);
    once.finish(why.end());
}

/// What the client gets at a cut: one SSE error event in its dialect, or
/// an error that aborts any other body.
fn cut_frame(sse: bool, why: Cut, client: Dialect) -> Result<Frame<Bytes>, BoxError> {
    if sse {
        Ok(Frame::data(why.event_in(client)))
    } else {
        Err(format!("answer cut: {why:?}").into())
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let (sse, client) = (this.sse, this.client);
        match &mut this.source {
            Source::Direct { inner, once } => {
                let Some(body) = inner.as_mut() else {
                    return Poll::Ready(None);
                };
                let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
                let ended = body.is_end_stream();
                match &frame {
                    Some(Ok(f)) => {
                        once.frame(f);
                        if ended {
                            once.finish(BodyEnd::Complete);
                        }
                    }
                    Some(Err(_)) => once.finish(BodyEnd::UpstreamError),
                    None => once.finish(BodyEnd::Complete),
                }
                Poll::Ready(frame.map(|f| f.map_err(BoxError::from)))
            }
            Source::Relayed { frames, cut, told } => {
                if *told {
                    return Poll::Ready(None);
                }
                match ready!(frames.poll_recv(cx)) {
                    Some(frame) => Poll::Ready(Some(frame)),
                    None => {
                        let code = cut.load(Ordering::Acquire);
                        match Cut::from_u8(code) {
                            // Told already (a translated stream's own
                            // error event): the body just ends.
                            Some(_) if code & TOLD != 0 => {
                                *told = true;
                                Poll::Ready(None)
                            }
                            Some(why) => {
                                *told = true;
                                Poll::Ready(Some(cut_frame(sse, why, client)))
                            }
                            None => Poll::Ready(None),
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Direct { inner, once } => {
                inner.as_ref().is_none_or(|b| b.is_end_stream()) && once.finished()
            }
            Source::Relayed { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Direct { inner: Some(b), .. } => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        if let Source::Direct { inner, once } = &mut self.source {
            let end = if inner.as_ref().is_some_and(|b| b.is_end_stream()) {
                BodyEnd::Complete
            } else {
                BodyEnd::ClientGone
            };
            once.finish(end);
        }
        // Relayed: dropping the receiver tells the task (`tx.closed()`).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_events_are_the_envelope_writers() {
        for (cut, label, message) in [
            (
                Cut::Deadline,
                "deadline_exhausted",
                "the request's deadline ran out; the stream was cut",
            ),
            (
                Cut::StreamError,
                "stream_error",
                "the backend reported an error inside the stream; the answer is incomplete",
            ),
            (
                Cut::Stalled,
                "stream_stalled",
                "the backend sent nothing for the stall timeout; the stream was cut",
            ),
        ] {
            let data = cut
                .event()
                .strip_prefix("event: error\ndata: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap();
            let got: serde_json::Value = serde_json::from_str(data).unwrap();
            let want = router_dialect::errors::openai_envelope(message, label, Some(label));
            assert_eq!(got, want, "{data}");
        }
    }
}
