//! One scenario's database: created fresh on the chaos cluster, migrated, given the suite's
//! evidence tables, filled with the workload, watched while it runs, dropped at the end.
//!
//! The evidence tables are the harness's ([`crate::harness::EVIDENCE_SQL`]).

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::types::Uuid;
use sqlx::PgPool;
use workpump_coordinator::{
    migrate, Operations, PgCoordinator, RegisterQueueParams, SetQueueSettingsParams,
    WorkCoordinator, DEFAULT_SCHEMA,
};
use workpump_testdb::Cluster;

use super::fleet::QUEUE;
use super::{Result, Rng};
use crate::harness::{EVIDENCE_SQL, SUITE_APP};

/// A scenario's database.
pub(crate) struct Db {
    pub(crate) name: String,
    pub(crate) pool: PgPool,
    admin: PgPool,
}

impl Db {
    /// Creates `name` on the cluster, migrates it, adds the evidence tables and registers
    /// the queue.
    pub(crate) async fn create(cluster: &Cluster, name: &str) -> Result<Db> {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&format!(
                "{}?application_name={SUITE_APP}",
                cluster.tcp_url("postgres")
            ))
            .await?;
        let leftover: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(name)
                .fetch_one(&admin)
                .await?;
        if leftover {
            sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
                .execute(&admin)
                .await?;
        }
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&admin)
            .await?;
        // The cluster is a test cluster (`synchronous_commit = off`), where a server crash
        // (an immediate stop) may lose commits that were already acknowledged — the ledger row
        // of an execution that then completed, say. Acknowledged commits must survive a crash
        // for the checks to hold, as they do on a production server. (`fsync` stays off: the
        // WAL reaches the OS at commit, and the OS does not crash here.)
        sqlx::query(&format!(
            "ALTER DATABASE \"{name}\" SET synchronous_commit = on"
        ))
        .execute(&admin)
        .await?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&format!(
                "{}?application_name={SUITE_APP}",
                cluster.tcp_url(name)
            ))
            .await?;
        migrate(&pool, DEFAULT_SCHEMA).await?;
        sqlx::raw_sql(EVIDENCE_SQL).execute(&pool).await?;
        PgCoordinator::new(pool.clone())
            .register_queue(RegisterQueueParams::new(QUEUE))
            .await?;
        Ok(Db {
            name: name.to_owned(),
            pool,
            admin,
        })
    }

    /// Gives the queue a fleet-wide running limit of `n`, as an operator does
    /// (`Operations::set_queue_settings`; `workpump settings chaos --max-running N`), and
    /// checks that the store holds it.
    pub(crate) async fn set_max_running(&self, n: u32) -> Result<()> {
        let stored = PgCoordinator::new(self.pool.clone())
            .set_queue_settings(SetQueueSettingsParams {
                max_running: Some(Some(n)),
                ..SetQueueSettingsParams::new(QUEUE)
            })
            .await?
            .max_running;
        if stored != Some(n) {
            return Err(format!("set max_running {n}, but the store holds {stored:?}").into());
        }
        Ok(())
    }

    /// Closes the pools and drops the database (`keep`: only closes them).
    pub(crate) async fn finish(self, keep: bool) -> Result<()> {
        self.pool.close().await;
        if !keep {
            sqlx::query(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .execute(&self.admin)
            .await?;
        }
        self.admin.close().await;
        Ok(())
    }

    /// Points the scenario's pool (and every clone of it, the feeder's too) at the server on
    /// `port` — a promoted standby — from now on: new connections go there, and those to the
    /// old server fail their ping and are dropped. The admin pool stays on the chaos cluster.
    pub(crate) fn move_to(&self, port: u16) {
        let options = (*self.pool.connect_options()).clone().port(port);
        self.pool.set_connect_options(options);
    }

    /// The port of the server the scenario's pool is on, and whether it is in recovery.
    pub(crate) async fn server(&self) -> Result<(i32, bool)> {
        Ok(
            sqlx::query_as("SELECT inet_server_port(), pg_is_in_recovery()")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// How the server reports the streaming standby `name` (`pg_stat_replication`):
    /// its state and sync state (`streaming`, `sync` for a synchronous one); None when it
    /// does not stream from this server.
    pub(crate) async fn replication_of(&self, name: &str) -> Result<Option<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How many rows each evidence table holds — the item audit, the ledger, the effects,
    /// the enqueued ids, the instance audit — in that order. They only grow, so a server
    /// that holds fewer than were seen on another lacks commits that were acknowledged.
    pub(crate) async fn evidence_rows(&self) -> Result<[i64; 5]> {
        let (a, l, e, q, i): (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM workpump_audit), (SELECT count(*) FROM workpump_ledger),
                    (SELECT count(*) FROM workpump_effects), (SELECT count(*) FROM workpump_enqueued),
                    (SELECT count(*) FROM workpump_instance_audit)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok([a, l, e, q, i])
    }

    /// The database clock, as seconds since the epoch.
    pub(crate) async fn now(&self) -> Result<f64> {
        Ok(
            sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    pub(crate) async fn progress(&self) -> Result<Progress> {
        let (total, finished, running): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*),
                    count(*) FILTER (WHERE state IN ('completed', 'dead', 'cancelled')),
                    count(*) FILTER (WHERE state = 'running')
             FROM workpump.work_all",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Progress {
            total,
            finished,
            running,
        })
    }

    /// The instances a process has run as: the one it printed, those it claimed under (a
    /// process evicted while paused registers a fresh one), and the one whose alive-lock its
    /// sessions hold now.
    pub(crate) async fn instances_of(
        &self,
        proc: &str,
        printed: Option<Uuid>,
    ) -> Result<Vec<Uuid>> {
        let mut ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT DISTINCT to_instance FROM workpump_audit
             WHERE proc = $1 AND to_token IS DISTINCT FROM from_token AND to_instance IS NOT NULL
             UNION
             SELECT i.instance_id FROM workpump.instances i
             JOIN workpump.alive_lock_held_keys() h ON h.key = i.alive_lock_key
             JOIN pg_stat_activity a ON a.pid = h.pid
             WHERE a.application_name = $1",
        )
        .bind(proc)
        .fetch_all(&self.pool)
        .await?;
        if let Some(id) = printed {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// The leases `instances` hold now: (item, claim token).
    pub(crate) async fn held_by(&self, instances: &[Uuid]) -> Result<Vec<(i64, i64)>> {
        Ok(sqlx::query_as(
            "SELECT id, claim_token FROM workpump.work_all
             WHERE state = 'running' AND instance_id = ANY($1) ORDER BY id",
        )
        .bind(instances)
        .fetch_all(&self.pool)
        .await?)
    }

    /// How many of the workers' processes (by `application_name`) hold an alive-lock, and
    /// how many have a LISTEN session.
    pub(crate) async fn sessions(&self) -> Result<(i64, i64)> {
        Ok(sqlx::query_as(
            "SELECT
                (SELECT count(DISTINCT a.application_name)
                 FROM workpump.alive_lock_held_keys() h
                 JOIN pg_stat_activity a ON a.pid = h.pid
                 WHERE a.application_name LIKE 'chaos-w%'),
                (SELECT count(DISTINCT a.application_name) FROM pg_stat_activity a
                 WHERE a.datname = current_database() AND a.application_name LIKE 'chaos-w%'
                   AND a.query LIKE 'LISTEN%')",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Terminates every worker's LISTEN session; how many.
    pub(crate) async fn kill_listeners(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.application_name LIKE 'chaos-w%'
               AND a.query LIKE 'LISTEN%' AND a.pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Work items running now (leased or orphaned).
    pub(crate) async fn running(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM workpump.work_all WHERE state = 'running'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The instance a worker (by name) is registered as now: its newest instance row.
    pub(crate) async fn instance_named(&self, proc: &str) -> Result<Option<Uuid>> {
        Ok(sqlx::query_scalar(
            "SELECT instance_id FROM workpump.instances WHERE host = $1
             ORDER BY started_at DESC LIMIT 1",
        )
        .bind(proc)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How old `instance`'s last heartbeat is (database clock, seconds); None when it has
    /// no row.
    pub(crate) async fn beat_age(&self, instance: Uuid) -> Result<Option<f64>> {
        Ok(sqlx::query_scalar(
            "SELECT extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8
             FROM workpump.instances WHERE instance_id = $1",
        )
        .bind(instance)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How old each registered worker instance's last heartbeat is (database clock,
    /// seconds).
    pub(crate) async fn beat_ages(&self) -> Result<Vec<f64>> {
        Ok(sqlx::query_scalar(
            "SELECT extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8
             FROM workpump.instances WHERE host LIKE 'chaos-w%'",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The session holding `instance`'s alive-lock, if one does: its pid and
    /// `application_name`.
    pub(crate) async fn lock_holder(&self, instance: Uuid) -> Result<Option<(i32, String)>> {
        Ok(sqlx::query_as(
            "SELECT h.pid, coalesce(a.application_name, '')
             FROM workpump.alive_lock_held_keys() h
             LEFT JOIN pg_stat_activity a ON a.pid = h.pid
             WHERE h.key = workpump.alive_lock_key($1)
             LIMIT 1",
        )
        .bind(instance)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Terminates the session of `proc` that holds `instance`'s alive-lock — only if the
    /// instance's last heartbeat is between `min_age` and `max_age` seconds old (database
    /// clock) at that moment, checked in the same statement — and waits up to 5 s for it to
    /// be gone. Returns the heartbeat's age, the pid, and whether it was terminated; None
    /// when the age was outside the window or no session of `proc` held the lock.
    pub(crate) async fn kill_lock_session_at_age(
        &self,
        instance: Uuid,
        proc: &str,
        min_age: f64,
        max_age: f64,
    ) -> Result<Option<(f64, i32, bool)>> {
        Ok(sqlx::query_as(
            "SELECT extract(epoch FROM clock_timestamp() - i.last_heartbeat_at)::float8, h.pid,
                    pg_terminate_backend(h.pid, 5000)
             FROM workpump.instances i
             JOIN workpump.alive_lock_held_keys() h ON h.key = i.alive_lock_key
             JOIN pg_stat_activity a ON a.pid = h.pid
             WHERE i.instance_id = $1 AND a.application_name = $2
               AND clock_timestamp() - i.last_heartbeat_at >= make_interval(secs => $3)
               AND clock_timestamp() - i.last_heartbeat_at < make_interval(secs => $4)
             LIMIT 1",
        )
        .bind(instance)
        .bind(proc)
        .bind(min_age)
        .bind(max_age)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The session that holds the fenced transaction of `item` open (the worker's `tx`
    /// payload with `hold_ms` names the item in its last query): its pid and
    /// `application_name`.
    pub(crate) async fn holding_session(&self, item: i64) -> Result<Option<(i32, String)>> {
        Ok(sqlx::query_as(
            "SELECT pid, application_name FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'
               AND query = format('SELECT ''holding the fenced transaction of item %s''', $1::bigint)
             LIMIT 1",
        )
        .bind(item)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Whether another transaction holds `item`'s row locked (a `FOR UPDATE SKIP LOCKED`
    /// probe, rolled back).
    pub(crate) async fn row_locked(&self, item: i64) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let free: Option<i64> =
            sqlx::query_scalar("SELECT id FROM workpump.work WHERE id = $1 FOR UPDATE SKIP LOCKED")
                .bind(item)
                .fetch_optional(&mut *tx)
                .await?;
        tx.rollback().await?;
        Ok(free.is_none())
    }

    /// `item`'s claim now: its state and claim token.
    pub(crate) async fn claim_of(&self, item: i64) -> Result<(String, Option<i64>)> {
        Ok(
            sqlx::query_as("SELECT state::text, claim_token FROM workpump.work_all WHERE id = $1")
                .bind(item)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The client backends of the workers in this database: (pid, `application_name`), by
    /// pid.
    pub(crate) async fn worker_backends(&self) -> Result<Vec<(i32, String)>> {
        Ok(sqlx::query_as(
            "SELECT pid, application_name FROM pg_stat_activity
             WHERE datname = current_database() AND backend_type = 'client backend'
               AND application_name LIKE 'chaos-w%'
             ORDER BY pid",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Which of `pids` still exist as server processes.
    pub(crate) async fn surviving(&self, pids: &[i32]) -> Result<Vec<i32>> {
        Ok(
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE pid = ANY($1) ORDER BY pid")
                .bind(pids)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Evictions recorded after `since` (database seconds): (instance, its process, the
    /// sweeping process, database seconds), oldest first.
    pub(crate) async fn evictions_since(
        &self,
        since: f64,
    ) -> Result<Vec<(Uuid, String, String, f64)>> {
        Ok(sqlx::query_as(
            "SELECT t.instance,
                    coalesce((SELECT d.host FROM workpump_instance_audit d
                              WHERE d.instance = t.instance AND d.host IS NOT NULL
                              ORDER BY d.seq DESC LIMIT 1), '?'),
                    t.proc, extract(epoch FROM t.at)::float8
             FROM workpump_instance_audit t
             WHERE t.op = 'tombstone' AND t.at > to_timestamp($1)
             ORDER BY t.seq",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Items completed since `since` (database seconds).
    pub(crate) async fn completed_since(&self, since: f64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM workpump_audit
             WHERE to_state = 'completed' AND at > to_timestamp($1)",
        )
        .bind(since)
        .fetch_one(&self.pool)
        .await?)
    }
}

/// A task of the suite that counts the items in state `running` (one statement, so one
/// snapshot of committed state) every 50 ms while a scenario runs: a witness of the running
/// limit independent of the audit's replay. It tolerates a database that is briefly away.
pub(crate) struct Sampler {
    /// Taken by `stop`; aborted on drop otherwise.
    task: Option<tokio::task::JoinHandle<(usize, i64)>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Sampler {
    pub(crate) fn start(db: &Db) -> Sampler {
        let pool = db.pool.clone();
        let (stop, mut stopping) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut samples, mut most) = (0, 0);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopping.wait_for(|s| *s) => return (samples, most),
                }
                let running: sqlx::Result<i64> = sqlx::query_scalar(
                    "SELECT count(*) FROM workpump.work_all WHERE state = 'running'",
                )
                .fetch_one(&pool)
                .await;
                if let Ok(n) = running {
                    samples += 1;
                    most = most.max(n);
                }
            }
        });
        Sampler {
            task: Some(task),
            stop,
        }
    }

    /// Stops sampling: how many samples were taken, and the most items running in one.
    pub(crate) async fn stop(mut self) -> Result<(usize, i64)> {
        self.stop.send_replace(true);
        let task = self.task.take().ok_or("the sampler was stopped twice")?;
        task.await
            .map_err(|e| format!("the running-count sampler: {e}").into())
    }
}

/// Where the work stands.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Progress {
    pub(crate) total: i64,
    pub(crate) finished: i64,
    pub(crate) running: i64,
}

/// `count` items that each hold a pool connection for `ms`, all due within `window_ms`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldBurst {
    pub(crate) count: usize,
    pub(crate) ms: (u64, u64),
    pub(crate) window_ms: (u64, u64),
}

/// What a scenario enqueues.
#[derive(Clone, Debug)]
pub(crate) struct Mix {
    pub(crate) items: usize,
    /// Items become due uniformly over this window, so that faults hit running work.
    pub(crate) spread_ms: u64,
    /// The `sleep` items' range.
    pub(crate) sleep_ms: (u64, u64),
    /// A burst of `hold` items (pool exhaustion).
    pub(crate) hold: Option<HoldBurst>,
    /// Items the suite cancels part-way through.
    pub(crate) cancels: usize,
    /// Ordering keys for the items, when set.
    pub(crate) keys: Option<KeySkew>,
}

/// How a keyed workload spreads its items over ordering keys: a share of them over a few
/// hot keys (skewed: hot key `k` weighs `1 / (k + 1)`), all due at once, so that each hot key
/// is a backlog that drains one item at a time through the faults; the rest over a long tail
/// of keys (one or two items each, on average), due over the spread. Designed dead letters
/// stay unkeyed: in the default `hold` policy a dead head would hold its key for good.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeySkew {
    pub(crate) hot: usize,
    pub(crate) hot_share: f64,
    pub(crate) tail: usize,
}

impl Mix {
    pub(crate) fn new(items: usize, spread_ms: u64) -> Mix {
        Mix {
            items,
            spread_ms,
            sleep_ms: (200, 2_500),
            hold: None,
            cancels: (items / 200).max(5),
            keys: None,
        }
    }
}

/// The workload: payloads by share — designed dead letters (~0.5 %, at least 5), planned
/// failures that retry then succeed (8 %), panics (2 %), transactional items (10 %),
/// checkpointed long jobs (2 %), sleepers that renew their lease (22 %), no-ops for the rest,
/// and a burst of `hold` items when asked; with `keys`, ordering keys (see [`KeySkew`]).
pub(crate) fn plan(rng: &mut Rng, mix: &Mix) -> Vec<(Value, u64)> {
    // At least 5 of a workload, but no more than 5 % of a small chunk (a feeder's).
    let dead = (mix.items / 200).max(5).min((mix.items / 20).max(1));
    let holds = mix.hold.map_or(0, |b| b.count);
    let mut planned = Vec::with_capacity(mix.items);
    for i in 0..mix.items {
        if let (Some(burst), true) = (mix.hold, i >= dead && i < dead + holds) {
            let payload = json!({ "kind": "hold", "ms": rng.range(burst.ms.0, burst.ms.1) });
            planned.push((payload, rng.range(burst.window_ms.0, burst.window_ms.1)));
            continue;
        }
        let payload = if i < dead {
            json!({ "kind": "dead" })
        } else {
            match rng.unit() {
                r if r < 0.08 => json!({ "kind": "fail", "times": rng.range(1, 2) }),
                r if r < 0.10 => json!({ "kind": "panic", "times": 1 }),
                r if r < 0.20 => json!({ "kind": "tx" }),
                r if r < 0.22 => {
                    json!({ "kind": "checkpoint", "units": 4, "unit_ms": rng.range(200, 600) })
                }
                r if r < 0.44 => {
                    json!({ "kind": "sleep", "ms": rng.range(mix.sleep_ms.0, mix.sleep_ms.1) })
                }
                _ => json!({ "kind": "noop" }),
            }
        };
        planned.push((payload, rng.range(0, mix.spread_ms)));
    }
    // Shuffle, so the designed dead letters are spread through the run.
    for i in (1..planned.len()).rev() {
        let j = rng.below(i + 1);
        planned.swap(i, j);
    }
    if let Some(skew) = mix.keys {
        let weights: Vec<f64> = (0..skew.hot).map(|k| 1.0 / (k as f64 + 1.0)).collect();
        let total: f64 = weights.iter().sum();
        for (payload, after) in &mut planned {
            if payload["kind"] == "dead" {
                continue;
            }
            let key = if rng.unit() < skew.hot_share {
                let mut pick = rng.unit() * total;
                let k = weights
                    .iter()
                    .position(|w| {
                        pick -= w;
                        pick < 0.0
                    })
                    .unwrap_or(skew.hot - 1);
                *after = 0;
                format!("hot-{k}")
            } else {
                format!("tail-{}", rng.below(skew.tail))
            };
            payload["ordering_key"] = Value::String(key);
        }
    }
    planned
}

/// Enqueues the planned items into the suite's queue (see [`crate::harness::enqueue`]).
pub(crate) async fn enqueue(pool: &PgPool, planned: Vec<(Value, u64)>) -> Result<Vec<i64>> {
    crate::harness::enqueue(pool, QUEUE, planned).await
}

/// Enqueues one item, due now; its id.
pub(crate) async fn enqueue_one(db: &Db, payload: Value) -> Result<i64> {
    let ids = enqueue(&db.pool, vec![(payload, 0)]).await?;
    Ok(ids.first().copied().ok_or("enqueue_work returned no id")?)
}

/// Cancels `n` items through `workpump.cancel_work`: half of them sleepers (likely running,
/// so the request travels in a renewal reply), the rest at random (likely waiting or done).
/// Records each answer in `workpump_cancels`; a finished item's refusal is recorded as such.
pub(crate) async fn cancel_some(db: &Db, rng: &mut Rng, n: usize) -> Result<Vec<(i64, String)>> {
    let sleepers: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.work_all
         WHERE payload->>'kind' = 'sleep' AND state IN ('running', 'available', 'scheduled')
         ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    let all: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.work_all WHERE payload->>'kind' <> 'dead' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    let mut chosen: Vec<i64> = Vec::new();
    for k in 0..n {
        let pool = if k % 2 == 0 && !sleepers.is_empty() {
            &sleepers
        } else {
            &all
        };
        if pool.is_empty() {
            break;
        }
        let id = pool[rng.below(pool.len())];
        if !chosen.contains(&id) {
            chosen.push(id);
        }
    }
    let mut answers = Vec::new();
    for id in chosen {
        let answer = match sqlx::query_scalar::<_, String>("SELECT workpump.cancel_work($1)")
            .bind(id)
            .fetch_one(&db.pool)
            .await
        {
            Ok(answer) => answer,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("WP005") => {
                "refused: finished".to_owned()
            }
            Err(e) => return Err(e.into()),
        };
        sqlx::query("INSERT INTO workpump_cancels (item, result) VALUES ($1, $2)")
            .bind(id)
            .bind(&answer)
            .execute(&db.pool)
            .await?;
        answers.push((id, answer));
    }
    Ok(answers)
}
