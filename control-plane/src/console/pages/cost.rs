//! What the tests that measure the pages' render time share
//! (docs/benchmarks.md, "The console (issue 33)").

use std::time::Duration;

use tokio::time::Instant;

use super::super::session::Session;
use crate::auth::Role;

/// A session to render pages for (an operator: every button drawn).
pub(super) fn session() -> Session {
    Session {
        role: Role::Operator { name: None },
        csrf: "0".repeat(64),
        expires: Instant::now() + Duration::from_secs(3600),
    }
}

/// Renders with `render` 3 times to warm up, then 20 times; prints the
/// median and the slowest, and the page's size; returns the size.
pub(super) fn time_renders(what: &str, mut render: impl FnMut() -> usize) -> usize {
    let mut bytes = 0;
    for _ in 0..3 {
        bytes = render();
    }
    let mut times: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            bytes = render();
            t.elapsed()
        })
        .collect();
    times.sort();
    println!(
        "{what}: median {:.1} ms, slowest {:.1} ms, {} KiB of HTML",
        times[10].as_secs_f64() * 1e3,
        times[19].as_secs_f64() * 1e3,
        bytes / 1024
    );
    bytes
}
