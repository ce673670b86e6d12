//! The control plane's handle on the proxies' shared store
//! (`router_shared_state::admin`, issue 32: the control plane no longer
//! links `redis`), against a real Redis: what a proxy's store parked,
//! reserved and rolled up is read back as the proxy wrote it; an
//! operator's change is the proxies' compare-and-set, so of two changes
//! racing one wins and the other gets a typed conflict (or, retried on the
//! task as it now is, a typed illegal transition); a store that is down
//! or silent fails typed and in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use router_policy::park::{Event, Illegal, ParkCaps, TaskRecord, TaskState};
use router_policy::rollup::{last_hours, Totals};
use router_policy::store_epoch::Epoch;
use router_policy::tenant::Budgets;
use router_policy::wall_clock::unix_ms;
use router_policy::Risk;
use router_shared_state::admin::tasks::ChangedBy;
use router_shared_state::admin::tenants::SpendCounters;
use router_shared_state::admin::MAX_ROLLUP_READS;
use router_shared_state::idempotency::IdempotencyStore;
use router_shared_state::rollup::{Rollups, Settled};
use router_shared_state::spend::SpendBudgets;
use router_shared_state::tasks::{ParkResult, RedisTasks, TaskStore};
use router_shared_state::{NoEvents, RedisStore, SharedStore, SharedStoreClient, StoreError};
use router_tests::harness::{eventually, WAIT_AT_MOST};
use router_tests::redis::RedisServer;

const CAPS: ParkCaps = ParkCaps {
    max_tasks: 100,
    max_bytes: 1 << 20,
    store_max_bytes: 1 << 20,
};

/// The store as a proxy holds it (`router:` prefix), connected.
async fn proxy_store(url: &str) -> Arc<RedisStore> {
    let client = SharedStore::new(url).unwrap().client().unwrap();
    let store = Arc::new(RedisStore::connect(
        client,
        router_shared_state::PREFIX.into(),
    ));
    eventually(WAIT_AT_MOST, "the proxy's store connected", || {
        store.connected()
    })
    .await;
    store
}

/// A task on `route`, parked `ago_ms` ago for a minute; SEND tasks wait
/// for approval.
fn task(id: &str, route: &str, risk: Risk, ago_ms: u64) -> TaskRecord {
    let mut t = router_shared_state::testing::task(id, route, unix_ms() - ago_ms);
    t.risk = risk;
    if risk == Risk::Send {
        t.state = TaskState::WaitingApproval;
    }
    t
}

async fn park(tasks: &RedisTasks, t: &TaskRecord) {
    let r = tasks.park(t, &Bytes::from_static(b"{}"), CAPS).await;
    assert!(matches!(r, Ok(ParkResult::Parked)), "{r:?}");
}

fn ids(v: &[router_shared_state::tasks::Versioned]) -> Vec<&str> {
    v.iter().map(|v| v.task.id.as_str()).collect()
}

fn alice() -> ChangedBy {
    ChangedBy {
        name: "alice".into(),
        role: "approver".into(),
        token: Some("ci-approver".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_a_proxy_parked_are_listed_read_and_changed() {
    let redis = RedisServer::start("admin-tasks").await;
    let proxy = RedisTasks::new(proxy_store(&redis.url()).await);
    let admin = SharedStoreClient::open(&redis.url()).unwrap();
    assert!(admin.list_tasks(None, None).await.unwrap().is_empty());
    park(&proxy, &task("a", "r1", Risk::Read, 3000)).await;
    park(&proxy, &task("b", "r1", Risk::Send, 2000)).await;
    park(&proxy, &task("c", "r2", Risk::Read, 1000)).await;

    // Listed oldest first, by state (as shown now) and route.
    assert_eq!(
        ids(&admin.list_tasks(None, None).await.unwrap()),
        ["a", "b", "c"]
    );
    let waiting = admin
        .list_tasks(Some(TaskState::WaitingApproval), None)
        .await
        .unwrap();
    assert_eq!(ids(&waiting), ["b"]);
    assert_eq!(
        ids(&admin.list_tasks(None, Some("r2")).await.unwrap()),
        ["c"]
    );
    let r1_capacity = admin
        .list_tasks(Some(TaskState::WaitingCapacity), Some("r1"))
        .await
        .unwrap();
    assert_eq!(ids(&r1_capacity), ["a"]);
    assert!(admin
        .list_tasks(Some(TaskState::Done), None)
        .await
        .unwrap()
        .is_empty());

    // One, and many in the order asked (the unknown left out).
    assert!(admin.task("nope").await.unwrap().is_none());
    let b = admin.task("b").await.unwrap().unwrap();
    assert_eq!(b.rev, proxy.get("b").await.unwrap().unwrap().rev);
    assert_eq!(b.task.risk, Risk::Send);
    let many = admin
        .tasks(&["c".into(), "nope".into(), "a".into()])
        .await
        .unwrap();
    assert_eq!(ids(&many), ["c", "a"]);

    // An approval, recorded with who; the proxy reads it at a new revision.
    let approved = admin
        .change_task("b", Event::Approve, &alice())
        .await
        .unwrap();
    assert_eq!(approved.state, TaskState::WaitingCapacity);
    assert!(approved.approved);
    let seen = proxy.get("b").await.unwrap().unwrap();
    assert!(seen.rev > b.rev, "{} after {}", seen.rev, b.rev);
    assert_eq!(seen.task.state, TaskState::WaitingCapacity);
    assert!(seen.task.approved);
    assert_eq!(seen.task.operator.as_deref(), Some("alice"));
    assert_eq!(seen.task.operator_role.as_deref(), Some("approver"));
    assert_eq!(seen.task.operator_token.as_deref(), Some("ci-approver"));
    // Approving again does not apply; an unknown task is not found.
    let again = admin.change_task("b", Event::Approve, &alice()).await;
    assert_eq!(
        again.unwrap_err(),
        StoreError::Illegal(Illegal::Wrong {
            event: "approve",
            state: "waiting_capacity"
        })
    );
    let missing = admin.change_task("nope", Event::Drop, &alice()).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );

    // A drop ends the task: it leaves the live list, its record is kept,
    // and nothing follows it.
    let dropped = admin.change_task("a", Event::Drop, &alice()).await.unwrap();
    assert_eq!(dropped.state, TaskState::Dropped);
    assert_eq!(
        ids(&admin.list_tasks(None, None).await.unwrap()),
        ["b", "c"]
    );
    let kept = admin.tasks(&["a".into()]).await.unwrap();
    assert_eq!(kept[0].task.state, TaskState::Dropped);
    let after = admin.change_task("a", Event::Approve, &alice()).await;
    assert_eq!(
        after.unwrap_err(),
        StoreError::Illegal(Illegal::Terminal("dropped"))
    );

    // A proxy's claim from the revision it read before an operator's drop
    // loses: the operator's change and the proxy's share one CAS.
    let before = proxy.get("c").await.unwrap().unwrap();
    admin.change_task("c", Event::Drop, &alice()).await.unwrap();
    let mut claimed = before.task.clone();
    claimed.apply(Event::Claim).unwrap();
    let lost = proxy
        .cas(before.rev, &claimed, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(lost, None, "a stale claim must not overwrite the drop");
    let c = admin.task("c").await.unwrap().unwrap();
    assert_eq!(c.task.state, TaskState::Dropped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_changes_racing_one_wins_and_the_other_gets_a_typed_conflict() {
    let redis = RedisServer::start("admin-race").await;
    let proxy = RedisTasks::new(proxy_store(&redis.url()).await);
    let admin = SharedStoreClient::open(&redis.url()).unwrap();
    let other = SharedStoreClient::open(&redis.url()).unwrap();
    for round in 0..10 {
        let id = format!("race-{round}");
        park(&proxy, &task(&id, "r", Risk::Send, 1000)).await;
        // Two writes from the same revision: one compare-and-set wins.
        let read = admin.task(&id).await.unwrap().unwrap();
        let mut approve = read.task.clone();
        approve.apply(Event::Approve).unwrap();
        let mut drop = read.task.clone();
        drop.apply(Event::Drop).unwrap();
        let (a, d) = tokio::join!(
            admin.cas_task(read.rev, &approve),
            other.cas_task(read.rev, &drop)
        );
        let stored = admin.task(&id).await.unwrap().unwrap();
        match (a, d) {
            (Ok(rev), Err(StoreError::Conflict(what))) => {
                assert_eq!(stored.rev, rev);
                assert_eq!(stored.task.state, TaskState::WaitingCapacity);
                assert!(what.contains(&id), "{what}");
            }
            (Err(StoreError::Conflict(_)), Ok(rev)) => {
                assert_eq!(stored.rev, rev);
                assert_eq!(stored.task.state, TaskState::Dropped);
            }
            other => panic!("round {round}: exactly one write wins: {other:?}"),
        }
        // The loser's revision is stale for good.
        let stale = admin.cas_task(read.rev, &approve).await;
        assert!(matches!(stale, Err(StoreError::Conflict(_))), "{stale:?}");
    }
    // Two operators approving at once: the loser reads the task again and
    // finds it approved, so one approval and one illegal transition.
    for round in 0..10 {
        let id = format!("twice-{round}");
        park(&proxy, &task(&id, "r", Risk::Send, 1000)).await;
        let who = alice();
        let (a, b) = tokio::join!(
            admin.change_task(&id, Event::Approve, &who),
            other.change_task(&id, Event::Approve, &who)
        );
        let illegal = StoreError::Illegal(Illegal::Wrong {
            event: "approve",
            state: "waiting_capacity",
        });
        match (a, b) {
            (Ok(t), Err(e)) | (Err(e), Ok(t)) => {
                assert_eq!(t.state, TaskState::WaitingCapacity);
                assert_eq!(e, illegal, "round {round}");
            }
            other => panic!("round {round}: exactly one approval: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_task_that_is_not_a_task_record_is_reported_and_not_listed() {
    let redis = RedisServer::start("admin-malformed").await;
    let proxy = RedisTasks::new(proxy_store(&redis.url()).await);
    let admin = SharedStoreClient::open(&redis.url()).unwrap();
    park(&proxy, &task("good", "r", Risk::Read, 1000)).await;
    redis
        .query(&["HSET", "router:task:bad", "rev", "1", "doc", "{not json"])
        .unwrap();
    redis.query(&["ZADD", "router:tasks", "1", "bad"]).unwrap();
    assert_eq!(ids(&admin.list_tasks(None, None).await.unwrap()), ["good"]);
    let bad = admin.task("bad").await;
    assert!(
        matches!(&bad, Err(StoreError::Malformed(m)) if m.contains("task bad is not a task record")),
        "{bad:?}"
    );
    let change = admin.change_task("bad", Event::Drop, &alice()).await;
    assert!(
        matches!(change, Err(StoreError::Malformed(_))),
        "{change:?}"
    );
    assert_eq!(
        ids(&admin.tasks(&["bad".into(), "good".into()]).await.unwrap()),
        ["good"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_and_rollups_read_back_as_the_proxies_wrote_them() {
    let redis = RedisServer::start("admin-tenants").await;
    let store = proxy_store(&redis.url()).await;
    let admin = SharedStoreClient::open(&redis.url()).unwrap();
    let now_s = unix_ms() / 1000;

    // Spend: one call settled at 300 of its 500 reserved, one in flight
    // with 1,000 reserved.
    let budgets = SpendBudgets::Shared(Arc::clone(&store));
    let hold = budgets
        .reserve("acme", Budgets::default(), 500, now_s)
        .await
        .unwrap();
    budgets.settle(&hold, Some(300)).await;
    budgets
        .reserve("acme", Budgets::default(), 1000, now_s)
        .await
        .unwrap();
    let usage = admin.tenant_usage("acme", now_s).await.unwrap();
    let (day, _, month, _) = router_policy::tenant::periods(now_s);
    assert_eq!(
        (usage.day.as_str(), usage.month.as_str()),
        (day.as_str(), month.as_str())
    );
    assert_eq!(
        usage.spend,
        SpendCounters {
            day: 1300,
            month: 1300,
            reserved: 1000
        }
    );
    assert_eq!(
        (usage.spend.spent_today(), usage.spend.spent_month()),
        (300, 300)
    );
    assert_eq!(usage.epoch, None);
    // The store's epoch marker is read with the counters.
    let epoch = Epoch {
        id: "e1".into(),
        since_unix_ms: 1_700_000_000_000,
        replaces: None,
    };
    assert_eq!(store.offer_epoch(&epoch.to_text()).await.unwrap(), None);
    let usage = admin.tenant_usage("acme", now_s).await.unwrap();
    assert_eq!(usage.epoch, Some(epoch));
    let idle = admin.tenant_usage("idle", now_s).await.unwrap();
    assert_eq!(idle.spend, SpendCounters::default());

    // Rollups, through the proxies' writer: two requests this hour (one
    // failed), one the hour before.
    let rollups = Rollups::spawn(Arc::clone(&store), Arc::new(NoEvents));
    let settled = |at: u64, tokens: u64, micros: u64, failed: bool| Settled {
        tenant: Arc::from("acme"),
        at_unix_secs: at,
        tokens,
        micros,
        failed,
    };
    rollups.record(settled(now_s, 10, 300, false));
    rollups.record(settled(now_s, 0, 0, true));
    rollups.record(settled(now_s - 3600, 5, 7, false));
    eventually(WAIT_AT_MOST, "three rollups written", || {
        rollups
            .counts()
            .written
            .load(std::sync::atomic::Ordering::Relaxed)
            == 3
    })
    .await;
    let hours = last_hours(now_s, 2);
    let page = admin
        .tenants_page(&["acme", "idle"], 2, &hours, now_s)
        .await
        .unwrap();
    assert_eq!(page.spend, [usage.spend, SpendCounters::default()]);
    assert_eq!(
        page.hours,
        [
            vec![
                Totals {
                    requests: 1,
                    tokens: 5,
                    micros: 7,
                    failed: 0
                },
                Totals {
                    requests: 2,
                    tokens: 10,
                    micros: 300,
                    failed: 1
                }
            ],
            vec![Totals::default(); 2]
        ]
    );
    // Only the first tenants are charted: `charted`, then the bound on
    // rollup reads.
    let page = admin
        .tenants_page(&["acme", "idle"], 1, &hours, now_s)
        .await
        .unwrap();
    assert_eq!((page.spend.len(), page.hours.len()), (2, 1));
    let many = last_hours(now_s, u64::try_from(MAX_ROLLUP_READS / 2 + 1).unwrap());
    let page = admin
        .tenants_page(&["acme", "idle", "third"], 3, &many, now_s)
        .await
        .unwrap();
    assert_eq!((page.spend.len(), page.hours.len()), (3, 1));
    assert_eq!(page.hours[0].len(), many.len());
    assert_eq!(
        page.hours[0].last(),
        Some(&Totals {
            requests: 2,
            tokens: 10,
            micros: 300,
            failed: 1
        })
    );
    assert_eq!(
        admin.tenants_page(&[], 20, &hours, now_s).await.unwrap(),
        Default::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_or_silent_fails_typed_and_within_its_time() {
    // Nothing listens: unavailable.
    let port = router_tests::server_process::free_port();
    let down = SharedStoreClient::open(&format!("redis://127.0.0.1:{port}")).unwrap();
    // The control plane's bound (docs/control-plane.md).
    assert_eq!(down.timeout(), Duration::from_secs(2));
    let r = down.list_tasks(None, None).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    let r = down.tenant_usage("acme", 0).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    // Accepts and never answers: a timeout, within the handle's bound
    // (a connection, then a call).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let slow = SharedStoreClient::open(&format!("redis://{addr}"))
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let r = slow.change_task("t", Event::Drop, &alice()).await;
    assert_eq!(r.unwrap_err(), StoreError::Timeout);
    let r = slow.tenants_page(&["acme"], 1, &[0], 0).await;
    assert_eq!(r.unwrap_err(), StoreError::Timeout);
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );
    held.abort();
    // Not a store URL: refused as the proxies refuse it, without its
    // password.
    let e = SharedStoreClient::open("http://:secret@127.0.0.1:1").unwrap_err();
    assert!(e.to_string().contains("expected redis://"), "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_handle_follows_the_proxies_rules() {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let redis =
        RedisServer::start_tls("admin-tls", &ck.cert.pem(), &ck.signing_key.serialize_pem()).await;
    // A certificate nobody trusts: refused.
    let strict = SharedStoreClient::open(&redis.url()).unwrap();
    let r = strict.list_tasks(None, None).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    // Told to skip verification (`#insecure`, for tests), as a proxy is:
    // it reads what a proxy parked over TLS.
    let insecure = format!("{}#insecure", redis.url());
    let proxy = RedisTasks::new(proxy_store(&insecure).await);
    park(&proxy, &task("tls", "r", Risk::Read, 1000)).await;
    let admin = SharedStoreClient::open(&insecure).unwrap();
    assert_eq!(ids(&admin.list_tasks(None, None).await.unwrap()), ["tls"]);
}
