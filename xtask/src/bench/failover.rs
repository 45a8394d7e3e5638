//! Failover: worker A holds 1 000 in-flight `sleep` items while peers B and C idle; A is
//! SIGKILLed; the time until all 1 000 run on a peer (or finished). Also when A's instance
//! row was reaped (the detection part). Once with the shipped defaults, once with short
//! liveness settings.

use std::time::{Duration, Instant};

use serde_json::json;

use super::drain::fill;
use super::setup::{BenchDb, MARK, SCHEMA};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};
use crate::harness::keys;

/// Items A holds.
const ITEMS: usize = 1_000;

/// The short liveness settings: heartbeat 0.5 s / 1 s, stale after 2 s, definitively dead
/// after 5 s, maintenance sweep every 0.5 s, idle polls at most 1 s apart, lease 3 s.
pub(crate) const SHORT_SETTINGS: &[(&str, u64)] = &[
    (keys::FAST_INTERVAL_MS, 500),
    (keys::SLOW_INTERVAL_MS, 1_000),
    (keys::STALE_AFTER_MS, 2_000),
    (keys::DEAD_AFTER_MS, 5_000),
    (keys::SWEEP_INTERVAL_MS, 500),
    ("claim.notify_healthy_base_ms", 500),
    ("claim.poll_max_ms", 1_000),
];

/// The short settings' lease.
pub(crate) const SHORT_LEASE_MS: u64 = 3_000;

/// One failover.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FailoverRun {
    /// SIGKILL → all items running on peers.
    pub(crate) total_s: f64,
    /// SIGKILL → A's instance row gone (reaped); `None` if it never was (lease expiry won).
    pub(crate) reaped_s: Option<f64>,
    /// How long after the peers were ready A was killed (the random sweep phase), s.
    pub(crate) kill_phase_s: f64,
}

pub(crate) async fn run(ctx: &Ctx, short: bool, runs: usize) -> BenchResult<Vec<FailoverRun>> {
    let mut out = Vec::with_capacity(runs);
    for i in 0..runs {
        let db = ctx.create_db("failover").await?;
        let result = once(ctx, &db, short).await;
        db.drop_now().await?;
        let run = result?;
        eprintln!(
            "bench: failover ({}) run {}/{runs}: {:.2} s (killed {:.2} s after the peers were ready; reaped after {})",
            if short { "short liveness" } else { "defaults" },
            i + 1,
            run.total_s,
            run.kill_phase_s,
            run.reaped_s
                .map_or("never".to_owned(), |s| format!("{s:.2} s"))
        );
        out.push(run);
    }
    Ok(out)
}

async fn once(ctx: &Ctx, db: &BenchDb, short: bool) -> BenchResult<FailoverRun> {
    let mut spec = Spec::defaults().concurrency(2 * ITEMS);
    if short {
        spec = spec.settings(SHORT_SETTINGS).lease_ms(SHORT_LEASE_MS);
    }
    db.settle().await?;
    let (mut doomed, _) =
        worker::start_all(&ctx.worker_bin, db.url(), &spec, 1, &ctx.logs, "failover-a").await?;
    let a = doomed
        .instance(0)
        .ok_or("worker A printed no instance id")?
        .to_string();
    fill(db, ITEMS, json!({ "kind": "sleep", "ms": 600_000 })).await?;
    let held = format!(
        "{MARK} SELECT count(*) FROM {SCHEMA}.work_all WHERE state = 'running' AND instance_id = $1::uuid"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(&held)
            .bind(&a)
            .fetch_one(db.pool())
            .await?;
        if n >= ITEMS as i64 {
            break;
        }
        doomed.check_alive()?;
        if Instant::now() > deadline {
            return Err(format!("failover: A holds only {n} of {ITEMS} items after 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut peers, _) = worker::start_all(
        &ctx.worker_bin,
        db.url(),
        &spec,
        2,
        &ctx.logs,
        "failover-peer",
    )
    .await?;

    // A crash comes at any moment: kill at a random phase of the peers' maintenance sweep
    // (they sweep at start and then every interval, so killing at once would always hit the
    // same phase). The interval is the short settings' or the shipped default.
    let sweep_ms: u64 = if short {
        500
    } else {
        workpump_host::MaintenanceConfig::default().interval_ms
    };
    let phase_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()) ^ d.as_secs())
        % sweep_ms;
    tokio::time::sleep(Duration::from_millis(phase_ms)).await;
    doomed.kill(0).await?;
    let killed = Instant::now();
    let progress = format!(
        "{MARK} SELECT (SELECT count(*) FROM {SCHEMA}.work_all
                 WHERE (state = 'running' AND instance_id IS NOT NULL AND instance_id <> $1::uuid)
                    OR state = 'completed'),
                EXISTS (SELECT 1 FROM {SCHEMA}.instances WHERE instance_id = $1::uuid)"
    );
    let limit = if short { 60 } else { 300 };
    let deadline = killed + Duration::from_secs(limit);
    let mut reaped_s = None;
    loop {
        let (moved, present): (i64, bool) = sqlx::query_as(&progress)
            .bind(&a)
            .fetch_one(db.pool())
            .await?;
        if !present && reaped_s.is_none() {
            reaped_s = Some(killed.elapsed().as_secs_f64());
        }
        if moved >= ITEMS as i64 {
            break;
        }
        peers.check_alive()?;
        if Instant::now() > deadline {
            return Err(format!(
                "failover: only {moved} of {ITEMS} items moved to peers {limit} s after the kill"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total_s = killed.elapsed().as_secs_f64();
    peers.kill_all().await;
    Ok(FailoverRun {
        total_s,
        reaped_s,
        kill_phase_s: phase_ms as f64 / 1_000.0,
    })
}
