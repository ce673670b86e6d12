//! [`router_process::shutdown_signal`] returns on SIGTERM, and not before.
//!
//! Its own test binary: the test sends SIGTERM to its whole process.

#![cfg(unix)]

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

#[tokio::test]
async fn sigterm_ends_the_wait() {
    // Our own SIGTERM listener installs tokio's handler before anything is
    // sent, so the signal cannot kill the test process.
    let mut ours = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut waiting = tokio::spawn(router_process::shutdown_signal());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiting)
            .await
            .is_err(),
        "returned without a signal"
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    ours.recv().await.expect("SIGTERM delivered");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("returns on SIGTERM")
        .expect("no panic");
}
