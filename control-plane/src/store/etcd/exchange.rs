//! The etcd side of the replicas' questions ([`crate::store::exchange`]
//! has the algorithm): `queries/<id>` and `answers/<id>/<replica>` on the
//! query's lease.
//!
//! The asker watches `answers/<id>/` before it puts the query (so no
//! answer can come before the watch), with etcd's `fragment` on (a batch
//! of answers arrives in pieces, never one message over the client's
//! limit). Each replica watches `queries/` from the moment it starts
//! answering: a question asked before that is not its to answer. A broken
//! watch resumes after the last query seen; a compacted one starts again
//! from now (the questions it skipped have long been given up on).
//! Deleted keys are filtered out by etcd (`NODELETE`): the lease's end
//! is nobody's question.

use std::collections::BTreeSet;

use router_etcd::pb::etcdserverpb::{watch_create_request::FilterType, PutRequest};

use super::*;
use crate::store::exchange::QUESTIONS_QUEUED;
use crate::store::exchange::{Asked, Query, Question, ANSWER_MAX_BYTES, QUERY_TTL};

/// A question's id as this replica makes them (a UUID); others are ignored.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The longest the asker waits for etcd to revoke a query's lease once
/// it is done (the lease expires on its own anyway).
const REVOKE_WAIT: Duration = Duration::from_secs(1);

/// `call` bounded by the asker's deadline (at the end of `wait`) as
/// well as its own.
async fn by<T>(
    deadline: tokio::time::Instant,
    wait: Duration,
    f: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout_at(deadline, f).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout(wait)),
    }
}

/// How long the answering replicas may wait for their proxies: three
/// quarters of the asker's wait, the rest for the answers to travel.
fn answer_wait(wait: Duration) -> Duration {
    wait.saturating_sub(wait / 4)
}

impl EtcdStore {
    /// The other replicas with presence records (by the replica each
    /// record names).
    async fn other_replicas(&self) -> Result<BTreeSet<String>, StoreError> {
        let resp = call(self.client.range(RangeRequest::prefix(self.keys.proxies()))).await?;
        Ok(resp
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<PublishedProxy>(&kv.value).ok())
            .map(|p| p.record.control_plane)
            .filter(|r| !r.is_empty() && *r != self.node)
            .collect())
    }

    /// [`Store::ask_replicas`].
    pub(super) async fn ask(
        &self,
        question: &Question,
        wait: Duration,
    ) -> Result<Asked, StoreError> {
        // Every etcd call within the page's wait, not only its own 5 s.
        let deadline = tokio::time::Instant::now() + wait;
        let expected = by(deadline, wait, self.other_replicas()).await?;
        if expected.is_empty() {
            return Ok(Asked::default());
        }
        let ttl = i64::try_from(QUERY_TTL.as_secs()).unwrap_or(10);
        let lease = by(deadline, wait, call(self.client.lease_grant(ttl)))
            .await?
            .id;
        let asked = self.ask_on(lease, question, wait, deadline, expected).await;
        // The query and every answer go with the lease, whatever happened.
        let revoked =
            tokio::time::timeout(REVOKE_WAIT, call(self.client.lease_revoke(lease))).await;
        if !matches!(revoked, Ok(Ok(()))) {
            tracing::debug!("a query's lease not revoked; it expires on its own");
        }
        asked
    }

    async fn ask_on(
        &self,
        lease: i64,
        question: &Question,
        wait: Duration,
        deadline: tokio::time::Instant,
        expected: BTreeSet<String>,
    ) -> Result<Asked, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let answers_at = self.keys.answers(&id);
        let mut watch = by(
            deadline,
            wait,
            call(self.client.watch(WatchCreateRequest {
                key: answers_at.clone().into_bytes(),
                range_end: prefix_end(answers_at.as_bytes()),
                fragment: true,
                filters: vec![FilterType::Nodelete as i32],
                ..WatchCreateRequest::default()
            })),
        )
        .await?;
        let query = Query {
            id: id.clone(),
            asker: self.node.clone(),
            wait_ms: u64::try_from(answer_wait(wait).as_millis()).unwrap_or(u64::MAX),
            question: question.clone(),
            lease,
        };
        let value = serde_json::to_vec(&query).map_err(backend)?;
        by(
            deadline,
            wait,
            call(self.client.put(PutRequest {
                key: self.keys.query(&id).into_bytes(),
                value,
                lease,
                ..PutRequest::default()
            })),
        )
        .await?;
        let mut asked = Asked {
            expected: expected.iter().cloned().collect(),
            ..Asked::default()
        };
        while !expected.iter().all(|r| asked.answers.contains_key(r)) {
            let resp = match tokio::time::timeout_at(deadline, watch.message()).await {
                Ok(Ok(Some(r))) => r,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the watch on a query's answers broke");
                    break;
                }
                Err(_) => break,
            };
            if resp.canceled || resp.compact_revision > 0 {
                break;
            }
            for event in &resp.events {
                let Some(kv) = event.kv.as_ref() else {
                    continue;
                };
                let replica = kv.key_str().and_then(|k| k.strip_prefix(&answers_at));
                let Some(replica) = replica else { continue };
                if kv.value.len() > ANSWER_MAX_BYTES {
                    tracing::warn!(
                        replica,
                        bytes = kv.value.len(),
                        "an answer over the cap; ignored"
                    );
                    continue;
                }
                asked.answers.insert(replica.to_string(), kv.value.clone());
            }
        }
        Ok(asked)
    }

    /// [`Store::questions`]: a watcher that ends with the receiver.
    pub(super) fn spawn_questions(&self) -> mpsc::Receiver<Query> {
        let (tx, rx) = mpsc::channel(QUESTIONS_QUEUED);
        tokio::spawn(watch_questions(
            self.client.clone(),
            self.keys.clone(),
            self.node.clone(),
            tx,
        ));
        rx
    }

    /// [`Store::answer`].
    pub(super) async fn put_answer(
        &self,
        query: &Query,
        answer: Vec<u8>,
    ) -> Result<(), StoreError> {
        if answer.len() > ANSWER_MAX_BYTES {
            return Err(backend(format!(
                "an answer of {} bytes, over the {ANSWER_MAX_BYTES}-byte cap",
                answer.len()
            )));
        }
        if !valid_id(&query.id) {
            return Err(backend("not a query id"));
        }
        call(self.client.put(PutRequest {
            key: self.keys.answer(&query.id, &self.node).into_bytes(),
            value: answer,
            lease: query.lease,
            ..PutRequest::default()
        }))
        .await?;
        Ok(())
    }
}

/// Passes the other replicas' queries to `tx` (dropping what does not fit)
/// until its receiver goes.
async fn watch_questions(client: Client, keys: Keys, node: String, tx: mpsc::Sender<Query>) {
    // 0: from now on.
    let mut from = 0i64;
    let mut backoff = BACKOFF_MIN;
    let queries = keys.queries();
    loop {
        if tx.is_closed() {
            return;
        }
        let create = WatchCreateRequest {
            key: queries.clone().into_bytes(),
            range_end: prefix_end(queries.as_bytes()),
            start_revision: from,
            filters: vec![FilterType::Nodelete as i32],
            ..WatchCreateRequest::default()
        };
        let watched = tokio::select! {
            w = call(client.watch(create)) => w,
            () = tx.closed() => return,
        };
        match watched {
            Ok(mut stream) => loop {
                let resp = tokio::select! {
                    r = stream.message() => r,
                    () = tx.closed() => return,
                };
                let resp = match resp {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "the watch on the replicas' queries broke");
                        break;
                    }
                };
                if resp.compact_revision > 0 {
                    from = 0;
                    break;
                }
                if resp.canceled {
                    break;
                }
                backoff = BACKOFF_MIN;
                for event in &resp.events {
                    let Some(kv) = event.kv.as_ref() else {
                        continue;
                    };
                    from = from.max(kv.mod_revision + 1);
                    if event.r#type() != EventType::Put {
                        continue;
                    }
                    let query = match serde_json::from_slice::<Query>(&kv.value) {
                        Ok(q) if valid_id(&q.id) => q,
                        Ok(_) | Err(_) => {
                            tracing::debug!(key = kv.key_str(), "not a query; ignored");
                            continue;
                        }
                    };
                    if query.asker == node {
                        continue;
                    }
                    if tx.try_send(query).is_err() {
                        tracing::warn!("a replica's query dropped: too many waiting");
                    }
                }
            },
            Err(e) => tracing::warn!(error = %e, "cannot watch the replicas' queries"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_ids_are_uuids_and_answers_leave_time_to_travel() {
        assert!(valid_id(&uuid::Uuid::now_v7().to_string()));
        for bad in ["", "a/b", "../state", &"a".repeat(65)] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert_eq!(
            answer_wait(Duration::from_secs(2)),
            Duration::from_millis(1500)
        );
    }
}
