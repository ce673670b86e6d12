//! Questions one control-plane replica asks the others through the store,
//! so the console's Decisions and Pools pages see the whole fleet.
//!
//! Those pages ask the proxies themselves (their route records, their
//! pools' load) over their config streams, and a replica holds only the
//! streams of the proxies connected to it. Replicas know each other's
//! names (their presence records, `proxies/<replica>/<proxy>`) but not
//! their addresses, and hold no credentials for each other; what they
//! share is the store. So the store is the rendezvous, and a question is
//! two kinds of short-lived keys (etcd: [`super::etcd`]):
//!
//! 1. The asking replica lists the replicas with presence records, grants
//!    a lease of [`QUERY_TTL`], starts watching `answers/<id>/` and puts
//!    `queries/<id>` on that lease: a [`Query`] as JSON (its kind,
//!    `decisions` or `load`, the request's parameters, the asker, how long
//!    the others may take).
//! 2. Every replica watches `queries/`; on a query of another replica it
//!    runs the same fetch the page runs, restricted to its own proxies,
//!    and puts `answers/<id>/<replica>` on the query's own lease. An
//!    answer is capped at [`ANSWER_MAX_BYTES`] (etcd refuses values over
//!    1.5 MiB): records are cut to fit, and the answer says how many.
//!    A replica answers [`ANSWERS_AT_ONCE`] questions at once at most;
//!    one asked more, or too far behind ([`QUESTIONS_QUEUED`]), leaves the
//!    rest unanswered.
//! 3. The asker gathers answers until every replica it listed answered or
//!    its wait is over, then revokes the lease: the query and every
//!    answer go with it, and late answers fail (the lease is gone). If the
//!    asker dies first, the lease expires on its own.
//!
//! Why keys and a lease rather than replica-to-replica calls: nothing new
//! to address, authenticate or open in a firewall; every key is under the
//! store's prefix, so a store user scoped to it (`--etcd-user`) is all a
//! replica needs; and a question leaves nothing behind whatever fails.
//! The cost, per page drawn: the asker reads the presence records,
//! grants and revokes a lease, opens a watch and puts the query; each
//! other replica puts one answer, which travels through etcd (at most
//! [`ANSWER_MAX_BYTES`], removed with the lease). Every call of the asker
//! is bounded by the page's wait. A replica that does not answer in time (dead but not
//! yet expired, partitioned, busy) is named by the asker; the pages list
//! its proxies as not answering.
//!
//! With one control plane (the embedded store) there is nobody to ask:
//! [`super::Store::ask_replicas`] answers `None` and nothing is written.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a query and its answers live if nobody removes them.
pub const QUERY_TTL: Duration = Duration::from_secs(10);
/// The largest answer a replica puts (etcd's own limit is 1.5 MiB a value).
pub const ANSWER_MAX_BYTES: usize = 512 * 1024;
/// The longest a replica spends on another's question, whatever it asks.
pub const MAX_ANSWER_WAIT: Duration = Duration::from_secs(5);
/// Questions a replica answers at once at most.
pub const ANSWERS_AT_ONCE: usize = 4;
/// Questions waiting to be answered at most (more are dropped).
pub const QUESTIONS_QUEUED: usize = 16;
/// Questions this replica asks at once at most (a page drawn while as
/// many are in flight shows this replica's proxies only, and says so).
pub const ASKS_AT_ONCE: usize = 8;

/// What a replica asks the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Question {
    /// Their proxies' latest route records (`Hub::fetch_decisions`).
    Decisions {
        /// Records asked of each proxy at most.
        max_records: u32,
        /// Bytes of lines asked of each proxy at most.
        max_bytes: u32,
    },
    /// Their proxies' load (`Hub::fetch_load`).
    Load,
}

/// A question as it travels (the value of `queries/<id>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Query {
    /// Names the question (and its answers' keys).
    pub id: String,
    /// The replica asking.
    pub asker: String,
    /// How long the answering replica may wait for its proxies (ms);
    /// the asker waits a little longer for the answers to travel.
    pub wait_ms: u64,
    /// The question.
    #[serde(flatten)]
    pub question: Question,
    /// The store's handle for the answers (etcd: the query's lease, which
    /// every answer is put on).
    #[serde(default)]
    pub lease: i64,
}

impl Query {
    /// The wait the answering replica allows itself (bounded).
    pub fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms).min(MAX_ANSWER_WAIT)
    }
}

/// What [`super::Store::ask_replicas`] gathered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// The other replicas that had presence records, which were waited for.
    pub expected: Vec<String>,
    /// The answers that arrived in time, by replica (each at most
    /// [`ANSWER_MAX_BYTES`]; larger ones are dropped).
    pub answers: BTreeMap<String, Vec<u8>>,
}

impl Asked {
    /// The replicas waited for that did not answer in time.
    pub fn silent(&self) -> Vec<String> {
        self.expected
            .iter()
            .filter(|r| !self.answers.contains_key(*r))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_json_with_its_kind_its_parameters_and_its_asker() {
        let q = Query {
            id: "q1".into(),
            asker: "cp-a".into(),
            wait_ms: 1500,
            question: Question::Decisions {
                max_records: 256,
                max_bytes: 1024,
            },
            lease: 7,
        };
        let json: serde_json::Value = serde_json::to_value(&q).unwrap();
        assert_eq!(json["kind"], "decisions");
        assert_eq!(json["max_records"], 256);
        assert_eq!(json["asker"], "cp-a");
        let back: Query = serde_json::from_value(json).unwrap();
        assert_eq!(back, q);
        let load: Query =
            serde_json::from_str(r#"{"id":"q2","asker":"cp-b","wait_ms":999999,"kind":"load"}"#)
                .unwrap();
        assert_eq!(load.question, Question::Load);
        assert_eq!(load.wait(), MAX_ANSWER_WAIT, "a long wait is bounded");
        let asked = Asked {
            expected: vec!["cp-b".into(), "cp-c".into()],
            answers: BTreeMap::from([("cp-b".to_string(), b"{}".to_vec())]),
        };
        assert_eq!(asked.silent(), ["cp-c"]);
    }
}
