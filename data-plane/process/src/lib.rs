//! `router-process`: the start and the end of every router program, written
//! once.
//!
//! - [`log_layer`] and [`init_logs`]: human-readable logs on stderr
//!   (coloured only on a terminal), filtered by `RUST_LOG` and at `info`
//!   when it is unset or invalid;
//! - [`shutdown_signal`]: waits for SIGTERM (what Kubernetes and
//!   `docker stop` send) or Ctrl-C.
//!
//! `router-proxy` and `router-control-plane` need both, `routerctl up` the
//! logs; each used to carry its own copy. The copies cannot live in either
//! plane's crate: the data plane never links the control plane, and the
//! control plane does not depend on the proxy; `router-policy` stays pure
//! (no tokio, no I/O). Hence this crate, which depends on neither plane, only
//! on tokio and tracing-subscriber. It sits under `data-plane/` because the
//! top-level layout is fixed and the proxy is its first user; the control
//! plane and `routerctl` depend on it as on any small library.
//!
//! The proxy adds its OpenTelemetry layer on top of [`log_layer`]; the other
//! programs call [`init_logs`].

#![forbid(unsafe_code)]

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The log filter and formatter: `RUST_LOG` (else `info`), then one line per
/// event on stderr, with colours only when stderr is a terminal.
///
/// For a program that adds layers of its own (the proxy's OpenTelemetry
/// export): `registry().with(log_layer()).with(other).init()`.
pub fn log_layer<S>() -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    filter.and_then(fmt)
}

/// Installs [`log_layer`] as the global subscriber.
///
/// # Panics
///
/// If a global subscriber is already installed (call it once, from `main`).
pub fn init_logs() {
    tracing_subscriber::registry().with(log_layer()).init();
}

/// Returns when the process is asked to stop: SIGTERM (what Kubernetes
/// sends) or Ctrl-C. Where SIGTERM cannot be watched (not Unix, or the
/// handler cannot be installed), Ctrl-C only.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
