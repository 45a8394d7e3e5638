//! Pickup latency on an idle system: one worker (default settings, listener healthy), items
//! of kind `probe` enqueued one at a time from this process, a fixed gap apart. The worker
//! prints `START <id> <unix µs>` when the handler starts; the bench notes the wall clock
//! when `enqueue_work` returned (the commit was acknowledged). Both clocks are this machine's
//! `CLOCK_REALTIME`.
//!
//! The commit became visible between sending the enqueue and its reply; it is the last step
//! before the reply (after the WAL flush), so `start − returned` is a lower bound that is
//! short of the truth by the reply's trip through the socket (tens of µs), and
//! `start − sent` an upper bound. Both are reported.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use workpump_coordinator::{EnqueueWorkParams, NewWork, WorkCoordinator};

use super::setup::{self, Statement, QUEUE, SCHEMA};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug)]
pub(crate) struct Pickup {
    pub(crate) samples: usize,
    /// From the enqueue's reply to the handler start (the reported figure).
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    /// From sending the enqueue to the handler start (upper bound), p50 and p99.
    pub(crate) upper_p50: f64,
    pub(crate) upper_p99: f64,
    /// Median enqueue round trip (the width of the bracket).
    pub(crate) enqueue_rtt_p50: f64,
    /// A cross-check on the database clock alone: the enqueue transaction's start
    /// (`created_at`) to the completing transaction's start (`finished_at`), p50 and p99, ms:
    /// the whole round (enqueue, NOTIFY, claim, handler, outcome write), not just pickup.
    pub(crate) db_enqueue_to_complete_p50: f64,
    pub(crate) db_enqueue_to_complete_p99: f64,
    /// What the database executed meanwhile (the worker's claims and completions, and the
    /// bench's enqueues), busiest first.
    pub(crate) statements: Vec<Statement>,
}

/// The pickup at the defaults, then with the queue's claims committed asynchronously
/// (`queues.<queue>.async_commit`, docs/guarantees.md), each in a fresh database.
pub(crate) async fn run(ctx: &Ctx) -> BenchResult<(Pickup, Pickup)> {
    let defaults = run_one(ctx, &Spec::defaults(), "pickup").await?;
    let async_commit =
        Spec::defaults().settings(&[(&*format!("queues.{QUEUE}.async_commit"), true)]);
    let asynchronous = run_one(ctx, &async_commit, "pickup_async").await?;
    Ok((defaults, asynchronous))
}

async fn run_one(ctx: &Ctx, spec: &Spec, name: &str) -> BenchResult<Pickup> {
    let samples = ctx.plan.pickup_samples;
    let gap = Duration::from_millis(20);
    let db = ctx.create_db(name).await?;
    db.settle().await?;
    let (mut workers, _) =
        worker::start_all(&ctx.worker_bin, db.url(), spec, 1, &ctx.logs, name).await?;
    // Idle: let the first polls find nothing and the claim loop settle into its wait.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let coordinator = db.coordinator();
    let stmts_before = db.statements().await?;
    let mut sent: HashMap<i64, (u128, u128)> = HashMap::with_capacity(samples);
    let mut next = Instant::now();
    for _ in 0..samples {
        tokio::time::sleep_until(next.into()).await;
        next += gap;
        let t_sent = unix_micros();
        let out = coordinator
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new(QUEUE, json!({ "kind": "probe" }))],
            })
            .await?;
        let t_returned = unix_micros();
        let id = out.items.first().ok_or("enqueue returned no id")?.id;
        sent.insert(id, (t_sent, t_returned));
    }

    let mut lower = Vec::with_capacity(samples);
    let mut upper = Vec::with_capacity(samples);
    let mut rtt = Vec::with_capacity(samples);
    let deadline = Instant::now() + Duration::from_secs(30);
    while lower.len() < samples {
        let Some(line) = workers.next_line(0, deadline.into()).await else {
            workers.check_alive()?;
            return Err(format!(
                "pickup: only {} of {samples} probes started within 30 s of the last enqueue",
                lower.len()
            )
            .into());
        };
        let mut parts = line.split_whitespace();
        if parts.next() != Some("START") {
            continue;
        }
        let (Some(id), Some(at)) = (
            parts.next().and_then(|p| p.parse::<i64>().ok()),
            parts.next().and_then(|p| p.parse::<u128>().ok()),
        ) else {
            continue;
        };
        let Some((t_sent, t_returned)) = sent.get(&id) else {
            continue;
        };
        lower.push((at as f64 - *t_returned as f64) / 1_000.0);
        upper.push((at as f64 - *t_sent as f64) / 1_000.0);
        rtt.push((*t_returned as f64 - *t_sent as f64) / 1_000.0);
    }
    let (db_p50, db_p99): (f64, f64) = sqlx::query_as(&format!(
        "{} SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d)
         FROM (SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 AS d
               FROM {SCHEMA}.work_all WHERE payload->>'kind' = 'probe' AND finished_at IS NOT NULL) x",
        setup::MARK
    ))
    .fetch_one(db.pool())
    .await?;
    let stmts = match (db.statements().await?, stmts_before) {
        (Some(after), Some(before)) => after.since(&before),
        _ => Vec::new(),
    };
    workers.terminate(Duration::from_secs(10)).await;
    db.drop_now().await?;
    Ok(Pickup {
        db_enqueue_to_complete_p50: (db_p50 * 1_000.0).round() / 1_000.0,
        db_enqueue_to_complete_p99: (db_p99 * 1_000.0).round() / 1_000.0,
        statements: stmts,
        samples,
        p50: percentile(&mut lower, 0.50),
        p90: percentile(&mut lower, 0.90),
        p99: percentile(&mut lower, 0.99),
        max: percentile(&mut lower, 1.0),
        upper_p50: percentile(&mut upper, 0.50),
        upper_p99: percentile(&mut upper, 0.99),
        enqueue_rtt_p50: percentile(&mut rtt, 0.50),
    })
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// The nearest-rank percentile `q` (0..=1) of `values`, rounded to µs.
pub(crate) fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    (values[rank - 1] * 1_000.0).round() / 1_000.0
}
