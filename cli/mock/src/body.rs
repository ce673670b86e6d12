//! The two pieces that let a request end any way a real one can: the
//! [`Tracker`], a drop guard that settles the counters and frees the
//! concurrency slot whether the answer completed, was rejected or was
//! abandoned by its client; and the [`MockBody`], a response body that
//! produces its frames one at a time, each after its own delay, so that an
//! SSE answer streams (one flushed frame per event) and a client that goes
//! away mid-answer drops the tracker with it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};

use crate::engine_http::EngineEvent;
use crate::server::{lock, Shared};
use crate::Generation;

/// How a tracked request ended, as far as known.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Not finished: counted as cancelled if dropped like this.
    Unfinished,
    /// The full answer was produced.
    Completed,
    /// Rejected over the cap (counted in `rejected_429`).
    Rejected,
}

/// Drop guard for one request: lives in the handler, then in the response
/// body, and settles the counters and the concurrency slot when dropped.
pub(crate) struct Tracker {
    shared: Arc<Shared>,
    request_id: Option<String>,
    /// Whether this request counts in `in_flight`.
    serving: bool,
    /// The concurrency slot, released after the counters are updated.
    permit: Option<OwnedSemaphorePermit>,
    outcome: Outcome,
}

impl Tracker {
    pub(crate) fn new(shared: Arc<Shared>, request_id: Option<String>) -> Tracker {
        Tracker {
            shared,
            request_id,
            serving: false,
            permit: None,
            outcome: Outcome::Unfinished,
        }
    }

    /// The request got its slot (if capped) and is now being served.
    pub(crate) fn start_serving(&mut self, permit: Option<OwnedSemaphorePermit>) {
        self.permit = permit;
        self.serving = true;
        let mut stats = lock(&self.shared.stats);
        stats.in_flight += 1;
        stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
    }

    pub(crate) fn reject(&mut self) {
        self.outcome = Outcome::Rejected;
        lock(&self.shared.stats).rejected_429 += 1;
    }

    fn complete(&mut self) {
        self.outcome = Outcome::Completed;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let mut stats = lock(&self.shared.stats);
        if self.serving {
            stats.in_flight -= 1;
        }
        match self.outcome {
            Outcome::Unfinished => stats.cancelled += 1,
            Outcome::Completed => {
                stats.completed += 1;
                lock(&self.shared.generations).push(Generation {
                    request_id: self.request_id.take(),
                    at: Instant::now(),
                });
            }
            Outcome::Rejected => {}
        }
        drop(stats);
        // Release the slot only now, so that the next request's `in_flight`
        // increment never overlaps this one.
        drop(self.permit.take());
    }
}

/// A response body made of frames, each produced after its own delay, one
/// frame per data chunk (so each is flushed on its own). The request's
/// [`Tracker`] rides along and is marked completed when the last frame is
/// produced; if hyper drops the body earlier (client gone) it counts as
/// cancelled.
pub(crate) struct MockBody {
    /// Remaining frames with the delay before each.
    frames: VecDeque<(Duration, Bytes)>,
    /// Whether the length is known up front (sent as `content-length`);
    /// otherwise the body is chunked.
    fixed_length: bool,
    /// The running delay before the first remaining frame.
    delay: Option<Pin<Box<Sleep>>>,
    /// After `frames`: frames made from a simulated engine's events as they
    /// come (see [`MockBody::live`]).
    live: Option<LiveFrames>,
    tracker: Option<Tracker>,
}

/// Turns an engine event into the bytes of one frame.
pub(crate) type FrameFormat = Box<dyn FnMut(EngineEvent) -> Bytes + Send>;

/// Frames made from engine events as they arrive.
pub(crate) struct LiveFrames {
    events: mpsc::UnboundedReceiver<EngineEvent>,
    format: FrameFormat,
}

impl MockBody {
    pub(crate) fn new(
        frames: VecDeque<(Duration, Bytes)>,
        fixed_length: bool,
        mut tracker: Option<Tracker>,
    ) -> MockBody {
        if frames.is_empty() {
            if let Some(tracker) = &mut tracker {
                tracker.complete();
            }
        }
        MockBody {
            frames,
            fixed_length,
            delay: None,
            live: None,
            tracker,
        }
    }

    /// A chunked body with one frame per engine event, made by `format`; it
    /// is complete after the [`EngineEvent::Finished`] frame. If the events
    /// stop before that (the engine went away), the body ends there and the
    /// request counts as cancelled.
    pub(crate) fn live(
        events: mpsc::UnboundedReceiver<EngineEvent>,
        format: FrameFormat,
        tracker: Option<Tracker>,
    ) -> MockBody {
        MockBody {
            frames: VecDeque::new(),
            fixed_length: false,
            delay: None,
            live: Some(LiveFrames { events, format }),
            tracker,
        }
    }

    /// A single-frame body sent at once with a `content-length`.
    pub(crate) fn full(data: Bytes, tracker: Option<Tracker>) -> MockBody {
        let frames = if data.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([(Duration::ZERO, data)])
        };
        MockBody::new(frames, true, tracker)
    }
}

impl MockBody {
    /// The next frame from the engine's events, if any.
    fn poll_live(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        match ready!(live.events.poll_recv(cx)) {
            Some(event) => {
                let last = matches!(event, EngineEvent::Finished(_));
                let data = (live.format)(event);
                if last {
                    self.live = None;
                    if let Some(tracker) = &mut self.tracker {
                        tracker.complete();
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => {
                self.live = None;
                Poll::Ready(None)
            }
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let Some(&(wait, _)) = this.frames.front() else {
            return this.poll_live(cx);
        };
        if !wait.is_zero() {
            let delay = this
                .delay
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
            ready!(delay.as_mut().poll(cx));
            this.delay = None;
        }
        let Some((_, data)) = this.frames.pop_front() else {
            return Poll::Ready(None);
        };
        if this.frames.is_empty() {
            if let Some(tracker) = &mut this.tracker {
                tracker.complete();
            }
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.live.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.fixed_length {
            let len = self.frames.iter().map(|(_, data)| data.len() as u64).sum();
            SizeHint::with_exact(len)
        } else {
            SizeHint::default()
        }
    }
}
