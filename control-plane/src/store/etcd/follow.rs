//! Following the other replicas' writes: list the keys, then watch from
//! the listed revision; a compacted or broken watch lists again. Only the
//! followed range ([`Keys::followed`]) is read.

use super::*;

/// Reads the state and the policies ([`Keys::followed`]); returns them
/// with the etcd revision they were read at.
pub(super) async fn list(client: &Client, keys: &Keys) -> Result<(Contents, i64), StoreError> {
    let (key, range_end) = keys.followed();
    let resp = call(client.range(RangeRequest {
        key,
        range_end,
        ..RangeRequest::default()
    }))
    .await?;
    let revision = resp.header.map_or(0, |h| h.revision);
    let mut contents = Contents::default();
    for kv in &resp.kvs {
        match decode(keys, kv) {
            Some(StoreEvent::State(s)) => contents.state = s,
            Some(StoreEvent::Policy(p)) => contents.history.push(p),
            Some(StoreEvent::PolicyRemoved(_)) | None => {}
        }
    }
    contents.history.sort_by_key(|p| p.version);
    Ok((contents, revision))
}

/// What a stored key means; `None` for keys that are not state or policy,
/// and for values that do not decode (logged, then skipped: a stray write
/// must not stop the control plane).
fn decode(keys: &Keys, kv: &KeyValue) -> Option<StoreEvent> {
    let key = kv.key_str()?;
    if key == keys.state() {
        match serde_json::from_slice::<State>(&kv.value) {
            Ok(mut state) => {
                state.revision = to_u64(kv.mod_revision);
                Some(StoreEvent::State(state))
            }
            Err(e) => {
                tracing::error!(key, error = %e, "undecodable state in etcd; ignored");
                None
            }
        }
    } else if key.starts_with(&keys.policies()) {
        match serde_json::from_slice::<PolicyRecord>(&kv.value) {
            Ok(p) => Some(StoreEvent::Policy(p)),
            Err(e) => {
                tracing::error!(key, error = %e, "undecodable policy in etcd; ignored");
                None
            }
        }
    } else {
        None
    }
}

/// How a watch ended.
enum WatchEnd {
    /// The start revision is gone: list again.
    Compacted,
    /// The stream broke; resume from `next`. `progressed` if anything arrived.
    Broken {
        next: i64,
        progressed: bool,
        error: String,
    },
    /// Nobody is listening any more.
    Closed,
}

/// The follower: list (when `from` is `None`), watch, and on the way out
/// either resume from where it stopped or list again.
pub(super) async fn follow(
    client: Client,
    keys: Keys,
    mut from: Option<i64>,
    tx: mpsc::Sender<StoreChange>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        if tx.is_closed() {
            return;
        }
        let start = match from {
            Some(r) => r,
            None => match list(&client, &keys).await {
                Ok((contents, revision)) => {
                    if tx.send(StoreChange::Relisted(contents)).await.is_err() {
                        return;
                    }
                    revision + 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "etcd listing failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
        };
        match watch(&client, &keys, start, &tx).await {
            WatchEnd::Compacted => {
                tracing::info!(from = start, "etcd compacted past the watch; listing again");
                from = None;
            }
            WatchEnd::Broken {
                next,
                progressed,
                error,
            } => {
                if progressed {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!(error, resume_at = next, retry_in = ?backoff, "etcd watch broke; resuming");
                from = Some(next);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            WatchEnd::Closed => return,
        }
    }
}

async fn watch(
    client: &Client,
    keys: &Keys,
    start: i64,
    tx: &mpsc::Sender<StoreChange>,
) -> WatchEnd {
    let (key, range_end) = keys.followed();
    let create = WatchCreateRequest {
        key,
        range_end,
        start_revision: start,
        ..WatchCreateRequest::default()
    };
    let mut stream = match call(client.watch(create)).await {
        Ok(s) => s,
        Err(e) => {
            return WatchEnd::Broken {
                next: start,
                progressed: false,
                error: e.to_string(),
            }
        }
    };
    let mut next = start;
    let mut progressed = false;
    loop {
        let resp = tokio::select! {
            r = stream.message() => r,
            () = tx.closed() => return WatchEnd::Closed,
        };
        let resp = match resp {
            Ok(Some(r)) => r,
            Ok(None) => {
                return WatchEnd::Broken {
                    next,
                    progressed,
                    error: "watch stream ended".into(),
                }
            }
            Err(e) => {
                return WatchEnd::Broken {
                    next,
                    progressed,
                    error: e.to_string(),
                }
            }
        };
        if resp.compact_revision > 0 {
            return WatchEnd::Compacted;
        }
        if resp.canceled {
            return WatchEnd::Broken {
                next,
                progressed,
                error: format!("watch cancelled: {}", resp.cancel_reason),
            };
        }
        progressed = true;
        let mut events = Vec::new();
        for event in &resp.events {
            let Some(kv) = event.kv.as_ref() else {
                continue;
            };
            next = next.max(kv.mod_revision + 1);
            match event.r#type() {
                EventType::Put => events.extend(decode(keys, kv)),
                EventType::Delete => {
                    let version = kv
                        .key_str()
                        .and_then(|k| k.strip_prefix(&keys.policies()))
                        .and_then(|v| v.parse::<u64>().ok());
                    events.extend(version.map(StoreEvent::PolicyRemoved));
                }
            }
        }
        if !events.is_empty() && tx.send(StoreChange::Changed(events)).await.is_err() {
            return WatchEnd::Closed;
        }
    }
}
