//! What replicas share besides records (`ring0_journal::deployment`), on PostgreSQL: one key per
//! purpose for all, sessions bounded per principal and forgotten when idle or deleted, jobs
//! seen by every replica with whether their replica is live, cancel requests, job tasks. Each
//! test runs in a schema of its own in the database `RING0_TEST_POSTGRES_URL` names (skipped
//! without one; failing under CI).

mod common;

use common::{admin, fresh_postgres_schema};
use futures::executor::block_on;
use ring0_journal::{
    Clock, Journal, PostgresJournal, PostgresOptions, SharedSession, SharedTask, SystemClock,
};
use std::sync::Arc;

fn replica(url: &str) -> PostgresJournal {
    PostgresJournal::open(
        url,
        PostgresOptions {
            clock: Arc::new(SystemClock) as Arc<dyn Clock>,
            pool_connections: 2,
            lease_ms: 60_000,
            ..PostgresOptions::default()
        },
    )
    .unwrap()
}

fn session(id: &str, principal: &str) -> SharedSession {
    SharedSession {
        id: id.into(),
        principal: principal.into(),
        state: format!("{{\"id\":{id:?}}}"),
    }
}

#[test]
fn every_replica_gets_the_same_key_for_a_purpose_and_another_for_another() {
    let Some(url) = fresh_postgres_schema() else {
        return;
    };
    let (a, b) = (replica(&url), replica(&url));
    let (a, b) = (a.deployment(), b.deployment());
    let key = block_on(a.shared_key("p")).unwrap();
    assert_eq!(key.len(), 32);
    assert_eq!(block_on(b.shared_key("p")).unwrap(), key);
    assert_ne!(block_on(b.shared_key("q")).unwrap(), key);
}

#[test]
fn sessions_are_bounded_per_principal_forgotten_when_idle_and_deleted_for_all() {
    let Some(url) = fresh_postgres_schema() else {
        return;
    };
    let (a, b) = (replica(&url), replica(&url));
    let (a, b) = (a.deployment(), b.deployment());
    let idle_ms = 60_000;
    for id in ["s1", "s2", "s3"] {
        block_on(a.session_put(&session(id, "alice"), 2, idle_ms)).unwrap();
    }
    block_on(a.session_put(&session("b1", "bob"), 2, idle_ms)).unwrap();
    // Alice's cap is 2: her least recently used made room; Bob's is untouched.
    assert_eq!(block_on(b.session_get("s1", idle_ms)).unwrap(), None);
    assert_eq!(
        block_on(b.session_get("s3", idle_ms)).unwrap(),
        Some(session("s3", "alice"))
    );
    assert!(block_on(b.session_get("b1", idle_ms)).unwrap().is_some());
    // Deleted through one replica: gone for the other.
    block_on(b.session_delete("s3")).unwrap();
    assert_eq!(block_on(a.session_get("s3", idle_ms)).unwrap(), None);
    // Idle past the bound: not served, and forgotten at the next recording.
    admin(&url, "UPDATE mcp_sessions SET used_ms = used_ms - 120000");
    assert_eq!(block_on(a.session_get("s2", idle_ms)).unwrap(), None);
    block_on(a.session_put(&session("b2", "bob"), 2, idle_ms)).unwrap();
    let rows = common_count(&url, "SELECT count(*) FROM mcp_sessions");
    assert_eq!(rows, 1, "only the fresh session is kept");
    // A state beyond the bound is refused, not stored.
    let mut big = session("big", "bob");
    big.state = "x".repeat(ring0_journal::deployment::SHARED_SESSION_STATE_BYTES_MAX + 1);
    assert!(block_on(a.session_put(&big, 2, idle_ms)).is_err());
}

#[test]
fn a_job_is_seen_by_every_replica_with_whether_its_replica_lives_and_can_be_asked_to_cancel() {
    let Some(url) = fresh_postgres_schema() else {
        return;
    };
    let (ja, jb) = (replica(&url), replica(&url));
    let (a, b) = (ja.deployment(), jb.deployment());
    block_on(a.job_put("job_1", "scope-x", r#"{"state":"RUNNING"}"#, false)).unwrap();
    let seen = block_on(b.job_get("job_1")).unwrap().unwrap();
    assert_eq!(seen.replica, a.replica());
    assert!(seen.replica_live && !seen.finished);
    assert_eq!(seen.owner, "scope-x");
    // Only its owner's request counts; its replica reads it.
    assert!(!block_on(b.job_request_cancel("job_1", "scope-y")).unwrap());
    assert!(block_on(a.jobs_to_cancel()).unwrap().is_empty());
    assert!(block_on(b.job_request_cancel("job_1", "scope-x")).unwrap());
    assert_eq!(block_on(a.jobs_to_cancel()).unwrap(), vec!["job_1"]);
    assert!(block_on(b.jobs_to_cancel()).unwrap().is_empty());
    // Another replica cannot overwrite it; its own can finish it.
    block_on(b.job_put("job_1", "scope-x", r#"{"state":"FORGED"}"#, true)).unwrap();
    assert!(!block_on(a.job_get("job_1")).unwrap().unwrap().finished);
    block_on(a.job_put("job_1", "scope-x", r#"{"state":"KILLED"}"#, true)).unwrap();
    let done = block_on(b.job_get("job_1")).unwrap().unwrap();
    assert!(done.finished && done.report.contains("KILLED"));
    assert!(block_on(a.jobs_to_cancel()).unwrap().is_empty());
    // A replica whose lease lapsed is no longer live.
    block_on(a.job_put("job_2", "scope-x", r#"{"state":"RUNNING"}"#, false)).unwrap();
    let me = ja.incarnation().unwrap();
    admin(
        &url,
        &format!("UPDATE replicas SET lease_until = '-infinity' WHERE incarnation = {me}"),
    );
    assert!(!block_on(b.job_get("job_2")).unwrap().unwrap().replica_live);
    assert_eq!(block_on(b.endpoint(me)).unwrap(), None);
}

#[test]
fn a_replica_is_reached_at_its_endpoint_while_its_lease_runs_and_a_task_is_seen_by_all() {
    let Some(url) = fresh_postgres_schema() else {
        return;
    };
    let (a, b) = (replica(&url), replica(&url));
    let (a, b) = (a.deployment(), b.deployment());
    block_on(a.advertise("http://127.0.0.1:1234")).unwrap();
    assert_eq!(
        block_on(b.endpoint(a.replica())).unwrap().as_deref(),
        Some("http://127.0.0.1:1234")
    );
    assert_eq!(block_on(b.endpoint(b.replica())).unwrap(), None);
    let task = SharedTask {
        task_id: "task_1".into(),
        owner: "o".into(),
        job: "job_1".into(),
        scope: "s".into(),
        modern: true,
        cancelled: false,
    };
    block_on(a.task_put(&task)).unwrap();
    assert_eq!(block_on(b.task_get("task_1")).unwrap(), Some(task.clone()));
    block_on(b.task_cancelled("task_1")).unwrap();
    assert!(block_on(a.task_get("task_1")).unwrap().unwrap().cancelled);
    assert_eq!(block_on(b.task_get("task_2")).unwrap(), None);
}

fn common_count(url: &str, sql: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        drop(client);
        let _ = driver.await;
        n
    })
}
