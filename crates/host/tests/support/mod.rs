//! What the host's end-to-end tests share: a fresh migrated database with an audit of every
//! item's state changes, a configuration with short liveness cutoffs, and waiting on a
//! condition with a deadline, scratch clusters stopped however a test ends, and a plain HTTP
//! GET for the health endpoints.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use sqlx::types::Uuid;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_host::HostConfig;
use workpump_testdb::TestDatabase;

/// The evidence tables the fault suite and the demo use too (the one copy): among them
/// `workpump_audit`, which triggers on `workpump.work` fill with a row for every change of an
/// item (state, owner, claim token, attempt, lease, ...), so a test can tell who recorded each
/// outcome, and how often.
const EVIDENCE_SQL: &str = include_str!("../../../../examples/sql/evidence.sql");

/// A fresh database, migrated, with the audit trigger, and a small pool on it for the test's
/// own queries.
pub async fn database() -> (TestDatabase, PgPool) {
    let FreshStore { pool, db, .. } = fresh_store().await;
    sqlx::raw_sql(EVIDENCE_SQL)
        .execute(&pool)
        .await
        .expect("the evidence tables");
    (db, pool)
}

/// A peer that may judge by every rule (`cleanup_stale_instances`): registered,
/// holding its alive-lock on the returned connection (keep it open), and watching the store
/// for an hour.
pub async fn seasoned_judge(url: &str) -> (PgConnection, Uuid) {
    let mut conn = PgConnection::connect(url).await.expect("connect the judge");
    let judge = Uuid::new_v4();
    sqlx::query(
        "SELECT * FROM workpump.record_heartbeat($1, 'judge', '{}', interval '30 s',
                                                 interval '5 min', interval '3 s', 0, true)",
    )
    .bind(judge)
    .execute(&mut conn)
    .await
    .expect("register the judge");
    let held: bool = sqlx::query_scalar("SELECT workpump.take_alive_lock($1)")
        .bind(judge)
        .fetch_one(&mut conn)
        .await
        .expect("the judge's lock");
    assert!(held);
    sqlx::query(
        "UPDATE workpump.instances SET lock_since = lock_since - interval '1 hour'
         WHERE instance_id = $1",
    )
    .bind(judge)
    .execute(&mut conn)
    .await
    .expect("age the judge's watch");
    (conn, judge)
}

/// Short liveness settings (beats every 200/400 ms, stale after 1 s, sweeps every 200 ms),
/// tight polling and quick restarts, so a test sees each mechanism within a second or two.
/// A drain cancels running handlers at once (no soft stop) and waits up to 5 s for them.
pub fn fast_config() -> HostConfig {
    let mut c = HostConfig {
        max_connections: 5,
        shutdown_soft_timeout_ms: 0,
        shutdown_timeout_ms: 5_000,
        ..HostConfig::default()
    };
    c.heartbeat.fast_interval_ms = 200;
    c.heartbeat.slow_interval_ms = 400;
    c.liveness.stale_after = Duration::from_secs(1);
    c.liveness.dead_after = Some(Duration::from_secs(3));
    c.maintenance.interval_ms = 200;
    c.claim.poll_base_ms = 50;
    c.claim.poll_max_ms = 500;
    c.claim.notify_healthy_base_ms = Some(500);
    c.supervision.restart_base_ms = 50;
    c.supervision.restart_max_ms = 1_000;
    c
}

/// Waits until `check` returns true, looking every 20 ms; panics naming `what` after
/// `within`.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks, every 50 ms for `span`, that `check` holds; panics naming `what` at the first look
/// at which it does not.
pub async fn holds_for<F, Fut>(span: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let until = Instant::now() + span;
    loop {
        let looked_at = Instant::now();
        if let Err(broken) = check().await {
            panic!(
                "{what} stopped holding after {:?} of {span:?}: {broken}",
                looked_at - (until - span)
            );
        }
        if looked_at >= until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many items are in `state`.
pub async fn count_state(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workpump.work_all WHERE state::text = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .expect("count items")
}

/// Items whose final outcome (completed, dead, cancelled) the audit saw more than once.
pub async fn recorded_twice(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT item FROM workpump_audit WHERE to_state IN ('completed', 'dead', 'cancelled')
             GROUP BY item HAVING count(*) > 1) d",
    )
    .fetch_one(pool)
    .await
    .expect("count doubles")
}

/// The instance that recorded each item's final outcome.
pub async fn outcome_writers(pool: &PgPool) -> Vec<(i64, Option<Uuid>)> {
    sqlx::query_as(
        "SELECT item, from_instance FROM workpump_audit
         WHERE to_state IN ('completed', 'dead', 'cancelled') ORDER BY item",
    )
    .fetch_all(pool)
    .await
    .expect("outcome writers")
}

/// A worker that only waits for shutdown, under a slot's name: a replacement that does
/// nothing.
pub struct Idle(pub &'static str);

#[async_trait::async_trait]
impl workpump_host::Worker for Idle {
    fn name(&self) -> &str {
        self.0
    }

    async fn run(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<(), workpump_coordinator::WorkerError> {
        shutdown.cancelled().await;
        Ok(())
    }
}

/// Stops a scratch cluster however the test ends.
pub struct StopOnDrop<'a>(pub &'a workpump_testdb::Cluster);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.stop() {
            eprintln!("stopping cluster {}: {e}", self.0.name());
        }
    }
}

/// Runs blocking cluster control (pg_ctl) off the runtime's worker thread.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// `GET path` over a fresh connection: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the health endpoints");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the response");
    let code = response
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a status line in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// The sum of the samples of metric `name` in a Prometheus text body whose labels contain
/// `label` (`""`: every sample).
pub fn metric_sum(body: &str, name: &str, label: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key.split('{').next()? == name && key.contains(label))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Serves the host's Prometheus endpoint on a free port of 127.0.0.1; its address.
pub fn metrics_on_a_free_port(config: &mut HostConfig) -> std::net::SocketAddr {
    let listen = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port");
    config.metrics.enabled = true;
    config.metrics.listen = listen;
    listen
}

/// How many times the store shows the item's lease renewed.
pub async fn renewals(pool: &PgPool, id: i64) -> i32 {
    sqlx::query_scalar("SELECT renewals FROM workpump.work_all WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("read the item's renewals")
}
