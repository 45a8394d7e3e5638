//! Drain: N no-op items enqueued in bulk into a paused queue (not timed), the workers started
//! and ready, then the queue resumed (with the wake NOTIFY); the rate is items over the time
//! from the resume to the last completion, both on the database clock.

use std::time::{Duration, Instant};

use serde_json::json;
use workpump_coordinator::{EnqueueWorkParams, NewWork, WorkCoordinator};

use super::ops::Beside;
use super::setup::{self, BenchDb, Statement, QUEUE, SCHEMA};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};

/// Items per enqueue call while filling the queue.
const FILL_BATCH: usize = 10_000;

/// One drain.
#[derive(Clone, Debug)]
pub(crate) struct DrainRun {
    pub(crate) workers: usize,
    pub(crate) items: usize,
    /// Items per second, database clock: resume → max(finished_at).
    pub(crate) rate: f64,
    pub(crate) seconds: f64,
    /// Spawn → every worker printed READY.
    pub(crate) startup_s: f64,
    pub(crate) wal_bytes_per_item: f64,
    /// CPU seconds of the server's processes and of the workers during the drain.
    pub(crate) server_cpu_s: Option<f64>,
    pub(crate) worker_cpu_s: f64,
    /// CPU seconds the rest of the machine used meanwhile (other programs, the bench).
    pub(crate) other_cpu_s: Option<f64>,
    /// What the database executed, busiest first.
    pub(crate) statements: Vec<Statement>,
    /// Items per second in each tenth of the items, in completion order.
    pub(crate) decile_rates: Option<Vec<f64>>,
}

impl DrainRun {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "items": self.items,
            "items_per_s": self.rate.round(),
            "seconds": self.seconds,
            "startup_s": self.startup_s,
            "wal_bytes_per_item": self.wal_bytes_per_item.round(),
            "server_cpu_s": self.server_cpu_s,
            "server_cpu_us_per_item": self.server_cpu_s.map(|s| (s * 1e6 / self.items as f64).round()),
            "worker_cpu_us_per_item": (self.worker_cpu_s * 1e6 / self.items as f64).round(),
            "worker_cpu_s": self.worker_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "decile_items_per_s": self.decile_rates,
            "statements": self.statements.iter().take(12).map(|s| json!({
                "statement": setup::short_name(&s.query),
                "calls": s.calls,
                "rows": s.rows,
                "total_ms": (s.total_ms * 10.0).round() / 10.0,
            })).collect::<Vec<_>>(),
        })
    }
}

/// One drain of `items` by `workers` processes.
pub(crate) async fn run_once(
    ctx: &Ctx,
    workers: usize,
    items: usize,
    deciles: bool,
) -> BenchResult<DrainRun> {
    let db = ctx.create_db("drain").await?;
    let result = drain(ctx, &db, workers, items, deciles, |_| None).await;
    db.drop_now().await?;
    result
}

/// [`run_once`] with something beside the drain: `open` gets the drain's database URL once
/// the workers are ready, and what it returns runs until the last item completes.
pub(crate) async fn run_once_beside(
    ctx: &Ctx,
    workers: usize,
    items: usize,
    open: impl FnOnce(&str) -> Option<Beside>,
) -> BenchResult<DrainRun> {
    let db = ctx.create_db("drain").await?;
    let result = drain(ctx, &db, workers, items, false, open).await;
    db.drop_now().await?;
    result
}

async fn drain(
    ctx: &Ctx,
    db: &BenchDb,
    n: usize,
    items: usize,
    deciles: bool,
    open: impl FnOnce(&str) -> Option<Beside>,
) -> BenchResult<DrainRun> {
    db.set_paused(true).await?;
    fill(db, items, json!({ "kind": "noop" })).await?;
    db.settle().await?;

    let spec = Spec::defaults().concurrency(ctx.options.drain_concurrency);
    let (mut workers, startup) =
        worker::start_all(&ctx.worker_bin, db.url(), &spec, n, &ctx.logs, "drain").await?;

    let beside = open(db.url());
    let stmts_before = db.statements().await?;
    let wal_before = db.wal_bytes().await?;
    let postmaster = ctx.target.postmaster_pid();
    let server_before = postmaster.map(setup::server_cpu_ticks);
    let workers_before: u64 = workers.cpu_ticks();
    let machine_before = setup::machine_busy_ticks();

    let t0 = db.set_paused(false).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120 + (items / 1_000) as u64);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if db.completed_progress().await? >= items as i64 {
            break;
        }
        workers.check_alive()?;
        if Instant::now() > deadline {
            let done = db.count("state = 'completed'").await?;
            return Err(format!(
                "drain of {items} items by {n} workers: only {done} completed after {:?}",
                started.elapsed()
            )
            .into());
        }
    }
    drop(beside);
    let worker_ticks = workers.cpu_ticks() - workers_before;
    let server_ticks = postmaster.map(|p| setup::server_cpu_ticks(p) - server_before.unwrap_or(0));
    let machine_ticks = setup::machine_busy_ticks() - machine_before;
    let wal_after = db.wal_bytes().await?;
    let stmts = match (db.statements().await?, stmts_before) {
        (Some(after), Some(before)) => after.since(&before),
        _ => Vec::new(),
    };
    workers.terminate(Duration::from_secs(10)).await;

    let completed = db.count("state = 'completed'").await?;
    if completed != items as i64 {
        return Err(format!("drain: {completed} of {items} items completed").into());
    }
    let end: f64 = sqlx::query_scalar(&format!(
        "{} SELECT extract(epoch FROM max(finished_at))::float8 FROM {SCHEMA}.work",
        setup::MARK
    ))
    .fetch_one(db.pool())
    .await?;
    let seconds = end - t0;
    let decile_rates = if deciles {
        Some(decile_rates(db, items, t0).await?)
    } else {
        None
    };
    let tick = ctx.ticks_per_second;
    Ok(DrainRun {
        workers: n,
        items,
        rate: items as f64 / seconds,
        seconds,
        startup_s: startup.as_secs_f64(),
        wal_bytes_per_item: (wal_after - wal_before) / items as f64,
        server_cpu_s: server_ticks.map(|t| t as f64 / tick),
        worker_cpu_s: worker_ticks as f64 / tick,
        other_cpu_s: server_ticks
            .map(|s| machine_ticks.saturating_sub(s + worker_ticks) as f64 / tick),
        statements: stmts,
        decile_rates,
    })
}

/// Enqueues `items` copies of `payload` in bulk calls of 10 000.
pub(crate) async fn fill(
    db: &BenchDb,
    items: usize,
    payload: serde_json::Value,
) -> BenchResult<()> {
    let coordinator = db.coordinator();
    let mut left = items;
    while left > 0 {
        let n = left.min(FILL_BATCH);
        let batch = (0..n)
            .map(|_| NewWork::new(QUEUE, payload.clone()))
            .collect();
        coordinator
            .enqueue_work(EnqueueWorkParams { items: batch })
            .await?;
        left -= n;
    }
    Ok(())
}

/// Items per second in each tenth of the items (by completion time).
async fn decile_rates(db: &BenchDb, items: usize, t0: f64) -> BenchResult<Vec<f64>> {
    let sql = format!(
        "{} SELECT array_agg(extract(epoch FROM t)::float8 ORDER BY i)
         FROM unnest((SELECT percentile_disc(ARRAY[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0])
                      WITHIN GROUP (ORDER BY finished_at) FROM {SCHEMA}.work)) WITH ORDINALITY AS u(t, i)",
        setup::MARK
    );
    let ends: Vec<f64> = sqlx::query_scalar(&sql).fetch_one(db.pool()).await?;
    let tenth = items as f64 / 10.0;
    let mut previous = t0;
    Ok(ends
        .into_iter()
        .map(|end| {
            let rate = tenth / (end - previous).max(1e-6);
            previous = end;
            rate.round()
        })
        .collect())
}
