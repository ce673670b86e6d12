//! Steady traffic for tests that watch something move while requests
//! flow (a ramp's steps, a rollback): a few clients each sending one
//! request after another to one URL until stopped, counting what they
//! sent and what did not get a 200.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use http::{Method, StatusCode};

use crate::harness::TestClient;

/// Clients sending until [`Steady::stop`].
pub struct Steady {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Steady {
    /// `clients` clients POSTing `body` (JSON) to `url`, one request at a
    /// time each.
    pub fn start(url: String, body: &'static str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let tasks = (0..clients)
            .map(|_| {
                let (stop, sent, failed, url) =
                    (stop.clone(), sent.clone(), failed.clone(), url.clone());
                tokio::spawn(async move {
                    let client = TestClient::new();
                    while !stop.load(Ordering::Relaxed) {
                        let r = client
                            .send(
                                Method::POST,
                                &url,
                                &[("content-type", "application/json")],
                                body,
                            )
                            .await;
                        sent.fetch_add(1, Ordering::Relaxed);
                        if r.status != StatusCode::OK {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            sent,
            failed,
            tasks,
        }
    }

    /// Stops the clients (each finishes its request); (sent, not 200).
    pub async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}
