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
//! does not read, and is passed through directly, with no task.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::forward::BoxError;
use crate::upstream::UpstreamBody;

/// What happens when a proxied answer's body ends.
pub(crate) trait Completion: Send + 'static {
    /// The first data frame arrived (time to first byte).
    fn first_byte(&mut self);
    /// A data frame passed (or, after the client left, was read).
    fn data(&mut self, _bytes: &Bytes) {}
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
}

/// The one SSE event sent when a stream is cut at its deadline.
const DEADLINE_EVENT: &str = "event: error\ndata: {\"error\":{\"type\":\"deadline_exhausted\",\"code\":\"deadline_exhausted\",\"message\":\"the request's deadline ran out; the stream was cut\"}}\n\n";

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
        /// Set by the task when the deadline cut the stream.
        cut: Arc<AtomicBool>,
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
    ) -> Self {
        let deadline = match (deadline, finish) {
            (None, true) => Some(crate::clock::later(
                Instant::now(),
                crate::clock::A_YEAR,
                crate::clock::A_YEAR,
            )),
            (d, _) => d,
        };
        let source = match deadline {
            None => Source::Direct {
                inner: Some(inner),
                once: Once::new(completion),
            },
            Some(deadline) => {
                let (tx, frames) = mpsc::channel(1);
                let cut = Arc::new(AtomicBool::new(false));
                tokio::spawn(relay(
                    inner,
                    Once::new(completion),
                    deadline,
                    tx,
                    Arc::clone(&cut),
                    finish,
                ));
                Source::Relayed {
                    frames,
                    cut,
                    told: false,
                }
            }
        };
        Self { source, sse }
    }
}

/// Reads the backend's body into `tx` until it ends, the client's side is
/// dropped, or `deadline` comes, whichever is first; runs the completion.
/// With `finish`, a client going away does not stop the reading: the
/// answer is read to its end (still bounded by `deadline`) for the
/// completion to keep.
async fn relay(
    mut inner: UpstreamBody,
    mut once: Once,
    deadline: Instant,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    cut: Arc<AtomicBool>,
    finish: bool,
) {
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    let mut gone = false;
    let ended = |gone: bool| {
        if gone {
            BodyEnd::FinishedAfterClientLeft
        } else {
            BodyEnd::Complete
        }
    };
    loop {
        let frame = tokio::select! {
            biased;
            () = &mut expired => break,
            () = tx.closed(), if !gone => {
                if finish {
                    gone = true;
                    continue;
                }
                return once.finish(BodyEnd::ClientGone);
            }
            f = inner.frame() => f,
        };
        match frame {
            None => return once.finish(ended(gone)),
            Some(Err(e)) => {
                once.finish(BodyEnd::UpstreamError);
                if !gone {
                    let _ = tx.send(Err(e.into())).await;
                }
                return;
            }
            Some(Ok(f)) => {
                once.frame(&f);
                let end = inner.is_end_stream();
                if !gone {
                    tokio::select! {
                        biased;
                        () = &mut expired => break,
                        sent = tx.send(Ok(f)) => if sent.is_err() {
                            if !finish {
                                return once.finish(BodyEnd::ClientGone);
                            }
                            gone = true;
                        },
                    }
                }
                if end {
                    return once.finish(ended(gone));
                }
            }
        }
    }
    // The deadline: the backend's body goes (its connection closes, the
    // backend stops), the lease is released, and the client learns of the
    // cut when it reads again.
    drop(inner);
    cut.store(true, Ordering::Release);
    once.finish(BodyEnd::DeadlineCut);
}

/// What the client gets at a cut: one SSE error event, or an error that
/// aborts any other body.
fn cut_frame(sse: bool) -> Result<Frame<Bytes>, BoxError> {
    if sse {
        Ok(Frame::data(Bytes::from_static(DEADLINE_EVENT.as_bytes())))
    } else {
        Err("deadline exhausted: answer cut".into())
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
        let sse = this.sse;
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
                    None if cut.load(Ordering::Acquire) => {
                        *told = true;
                        Poll::Ready(Some(cut_frame(sse)))
                    }
                    None => Poll::Ready(None),
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
