//! Standalone mode: the policy file, watched and reloaded.
//!
//! The file is re-read every `CUSTOM_ROUTER_POLICY_POLL_INTERVAL` (1 s) and
//! compared byte for byte with the last version seen. Polling, rather than
//! inotify, also follows the symlink swap Kubernetes uses to update a
//! mounted ConfigMap and editors that replace the file on save. A changed
//! file is parsed and validated off to the side; only a valid policy is
//! applied. A bad edit is logged with every reason and counted
//! (`router_config_reloads_total{result="rejected"}`), and the last good
//! policy keeps serving.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use router_policy::document::load_with;
use router_policy::{Guards, Policy, PolicyError, QueueSettings};

use crate::config::ConfigStore;

/// Errors of loading a policy file.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The policy is invalid.
    #[error("policy file {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        source: PolicyError,
    },
}

/// Reads, parses and validates a policy file (against this proxy's
/// `guards`).
pub(crate) fn load_policy_file(
    path: &Path,
    defaults: &QueueSettings,
    guards: &Guards,
) -> Result<(Policy, Vec<u8>), PolicyFileError> {
    let bytes = std::fs::read(path).map_err(|source| PolicyFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let policy = load_with(&text, defaults, guards).map_err(|source| PolicyFileError::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((policy, bytes))
}

/// Watches `path` and applies every valid change to `store`, until the
/// task is aborted.
pub(crate) async fn watch_policy_file(
    path: PathBuf,
    store: Arc<ConfigStore>,
    defaults: QueueSettings,
    guards: Guards,
    interval: Duration,
    mut last: Vec<u8>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                // A file briefly missing during an atomic replace is normal;
                // keep serving and look again.
                tracing::debug!(path = %path.display(), error = %e, "policy file unreadable");
                continue;
            }
        };
        if bytes == last {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        match load_with(&text, &defaults, &guards) {
            Ok(policy) => {
                let version = store.apply_policy(policy, "file");
                tracing::info!(path = %path.display(), version = &*version, "policy reloaded");
            }
            Err(e) => {
                store.rejected();
                tracing::warn!(
                    path = %path.display(),
                    serving = &*store.load().version,
                    error = %e,
                    "policy change rejected; the last good policy keeps serving"
                );
            }
        }
        last = bytes;
    }
}
