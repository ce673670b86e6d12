//! The pool's one wake timer.
//!
//! Dispatch is event-driven: releases, samples and probe readings run it.
//! One kind of event comes from no request, though: time passing. An open
//! circuit's period ends, or a control-plane override expires, and an
//! endpoint that took nothing can take the waiters' requests. When waiters
//! remain and nothing is eligible, the pool arms this timer for the next
//! such instant ([`super::circuit::Breaker::next_change`]), and the timer
//! runs dispatch then.
//!
//! Each pool has at most one timer task, spawned the first time it is
//! armed and re-armed through a `watch` channel: arming for an earlier
//! instant moves its sleep, arming for a later one changes nothing (the
//! earlier wake will arm again if needed). The task holds the pool weakly
//! and ends when the pool, and with it the channel's sender, is dropped.
//!
//! All state here changes under the pool's lock.

use std::sync::{Arc, Weak};

use tokio::sync::watch;
use tokio::time::Instant;

/// When the pool's timer task next runs dispatch.
#[derive(Debug, Default)]
pub(super) struct WakeTimer {
    /// The instant the task sleeps until, if armed.
    armed: Option<Instant>,
    /// Tells the task its new instant; `None` before the task is spawned.
    bell: Option<watch::Sender<Option<Instant>>>,
}

impl WakeTimer {
    /// Arms the timer to call `on_wake(target, at)` at `at`, unless it is
    /// armed for `at` or earlier already. Outside a tokio runtime, does
    /// nothing (there is nothing to wake either).
    pub(super) fn arm<T: Send + Sync + 'static>(
        &mut self,
        at: Instant,
        target: &Arc<T>,
        on_wake: fn(&Arc<T>, Instant),
    ) {
        if let Some(bell) = &self.bell {
            if self.armed.is_some_and(|armed| armed <= at) && !bell.is_closed() {
                return;
            }
            if bell.send(Some(at)).is_ok() {
                self.armed = Some(at);
                return;
            }
            // The task is gone (its runtime shut down): spawn another.
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (bell, rx) = watch::channel(Some(at));
        runtime.spawn(run(Arc::downgrade(target), on_wake, rx));
        self.bell = Some(bell);
        self.armed = Some(at);
    }

    /// The task woke for `at`: disarms, unless it was re-armed meanwhile.
    pub(super) fn fired(&mut self, at: Instant) {
        if self.armed == Some(at) {
            self.armed = None;
            if let Some(bell) = &self.bell {
                bell.send_replace(None);
            }
        }
    }
}

/// The timer task: sleeps until the armed instant (moving with it), wakes
/// the target, waits to be armed again.
async fn run<T>(
    target: Weak<T>,
    on_wake: fn(&Arc<T>, Instant),
    mut bell: watch::Receiver<Option<Instant>>,
) {
    loop {
        let armed = *bell.borrow_and_update();
        let Some(at) = armed else {
            if bell.changed().await.is_err() {
                return;
            }
            continue;
        };
        match tokio::time::timeout_at(at, bell.changed()).await {
            // Re-armed: sleep until the new instant.
            Ok(Ok(())) => {}
            // The pool is gone.
            Ok(Err(_)) => return,
            Err(_elapsed) => {
                let Some(target) = target.upgrade() else {
                    return;
                };
                // Disarms (through `fired`), which changes the value read
                // at the top of the loop: no second wake for `at`.
                on_wake(&target, at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// Records its wakes; disarms like a pool does.
    #[derive(Default)]
    struct Target {
        timer: Mutex<WakeTimer>,
        woken: Mutex<Vec<Instant>>,
    }

    fn on_wake(t: &Arc<Target>, at: Instant) {
        t.timer.lock().unwrap().fired(at);
        t.woken.lock().unwrap().push(Instant::now());
    }

    fn arm(t: &Arc<Target>, at: Instant) {
        t.timer.lock().unwrap().arm(at, t, on_wake);
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_once_at_the_earliest_armed_instant() {
        let t0 = Instant::now();
        let t = Arc::new(Target::default());
        arm(&t, t0 + MS * 300);
        arm(&t, t0 + MS * 100);
        // Later than what is armed: no effect.
        arm(&t, t0 + MS * 200);
        tokio::time::sleep(MS * 1000).await;
        assert_eq!(*t.woken.lock().unwrap(), vec![t0 + MS * 100]);
        // Armed again after a wake.
        arm(&t, t0 + MS * 1500);
        tokio::time::sleep(MS * 1000).await;
        assert_eq!(
            *t.woken.lock().unwrap(),
            vec![t0 + MS * 100, t0 + MS * 1500]
        );
    }

    #[test]
    fn a_task_lost_with_its_runtime_is_replaced() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let t = Arc::new(Target::default());
        // Armed, then the runtime (and the task) goes before the wake.
        runtime().block_on(async { arm(&t, Instant::now() + MS * 100) });
        runtime().block_on(async {
            let t0 = Instant::now();
            arm(&t, t0 + MS * 200);
            tokio::time::sleep(MS * 300).await;
            assert_eq!(*t.woken.lock().unwrap(), vec![t0 + MS * 200]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn one_task_however_often_it_is_armed() {
        let t0 = Instant::now();
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let t = Arc::new(Target::default());
        for i in 0..50 {
            arm(&t, t0 + MS * (1000 - i));
        }
        assert_eq!(metrics.num_alive_tasks(), before + 1);
        tokio::time::sleep(MS * 2000).await;
        assert_eq!(t.woken.lock().unwrap().len(), 1);
        // The task ends with its target.
        drop(t);
        tokio::time::sleep(MS).await;
        assert_eq!(metrics.num_alive_tasks(), before);
    }
}
