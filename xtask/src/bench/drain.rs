//! Drain: N no-op items enqueued in bulk into a paused queue (timed apart, not part of the
//! rate), the workers started and ready, then the queue resumed (with the wake NOTIFY); the
//! rate is items over the time from the resume to the last completion, both on the database
//! clock. A [`Shape`] says what is drained: unkeyed items (`drain_<n>`), or items over
//! ordering keys (`keyed`), or items of a queue with a fleet-wide limit (`fleet-limit`, `rate`:
//! the limits set on the queue before the workers start, a sampler of the queue's running
//! count beside the drain, the starts in a window of the rate); [`Pairs`] holds drains of two
//! shapes run alternately, for figures that are a ratio to the plain drain of the same run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{ConnectOptions, Connection};
use workpump_coordinator::{
    EnqueueWorkParams, NewWork, Operations, RateLimit, SetQueueSettingsParams, WorkCoordinator,
};

use super::ops::Beside;
use super::setup::{self, BenchDb, Statement, QUEUE, SCHEMA};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};

/// Items per enqueue call while filling the queue.
const FILL_BATCH: usize = 10_000;

/// How often the running-count sampler reads the queue's running count.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// What one drain runs.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub(crate) workers: usize,
    pub(crate) items: usize,
    /// Ordering keys: `None`, unkeyed; `Some(n)`, item `i` (in enqueue order) carries key
    /// `key-<i % n>`, so each key's items are spread evenly over the enqueue, as a key's
    /// events arrive over time.
    pub(crate) keys: Option<usize>,
    /// Report the rate of each tenth of the items (the deep drain).
    pub(crate) deciles: bool,
    /// Handlers per worker; `None`: the drain's (`--concurrency`).
    pub(crate) concurrency: Option<usize>,
    /// Each item's handler sleeps this long (`{"kind":"sleep","ms":..}`); `None`: a no-op.
    pub(crate) handler_ms: Option<u64>,
    /// The queue's fleet-wide running limit (`max_running`) during the drain.
    pub(crate) max_running: Option<u32>,
    /// The queue's rate limit during the drain, and the window its starts are counted in
    /// ([`RateWindow`]).
    pub(crate) rate: Option<(RateLimit, Duration)>,
    /// Sample the queue's running count beside the drain ([`RunningSamples`]).
    pub(crate) sample_running: bool,
}

impl Shape {
    /// `items` unkeyed no-op items drained by `workers` processes.
    pub(crate) fn plain(workers: usize, items: usize) -> Shape {
        Shape {
            workers,
            items,
            keys: None,
            deciles: false,
            concurrency: None,
            handler_ms: None,
            max_running: None,
            rate: None,
            sample_running: false,
        }
    }

    pub(crate) fn keys(mut self, keys: usize) -> Shape {
        self.keys = Some(keys);
        self
    }

    pub(crate) fn deciles(mut self) -> Shape {
        self.deciles = true;
        self
    }

    pub(crate) fn concurrency(mut self, handlers: usize) -> Shape {
        self.concurrency = Some(handlers);
        self
    }

    pub(crate) fn handler_ms(mut self, ms: u64) -> Shape {
        self.handler_ms = Some(ms);
        self
    }

    pub(crate) fn max_running(mut self, limit: u32) -> Shape {
        self.max_running = Some(limit);
        self
    }

    /// The queue limited to `rate`, its starts counted over `window` after the first period
    /// (the burst of a full bucket).
    pub(crate) fn rate(mut self, rate: RateLimit, window: Duration) -> Shape {
        self.rate = Some((rate, window));
        self
    }

    pub(crate) fn sample_running(mut self) -> Shape {
        self.sample_running = true;
        self
    }

    /// What each item asks its handler to do.
    fn payload(&self) -> serde_json::Value {
        match self.handler_ms {
            Some(ms) => json!({ "kind": "sleep", "ms": ms }),
            None => json!({ "kind": "noop" }),
        }
    }
}

/// One drain.
#[derive(Clone, Debug)]
pub(crate) struct DrainRun {
    pub(crate) workers: usize,
    pub(crate) items: usize,
    /// The ordering keys the items were spread over (`None`: unkeyed).
    pub(crate) keys: Option<usize>,
    /// Items per second of the fill (bulk `enqueue_work` calls of 10 000, wall clock).
    pub(crate) enqueue_rate: f64,
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
    /// Keyed drains: the time between the completions of consecutive items of one key.
    pub(crate) key_gaps: Option<KeyGaps>,
    /// The queue's fleet-wide running limit during the drain.
    pub(crate) max_running: Option<u32>,
    /// The queue's running count sampled beside the drain.
    pub(crate) running: Option<RunningSamples>,
    /// Rate-limited drains: the starts in the measured window.
    pub(crate) rate_window: Option<RateWindow>,
}

/// The queue's running count (`state = 'running'`, what `max_running` bounds), read every
/// 5 ms on a connection of its own beside the drain, from the first read that found an item
/// running until the drain saw its last completion (polled every 100 ms).
#[derive(Clone, Debug, Default)]
pub(crate) struct RunningSamples {
    pub(crate) samples: usize,
    pub(crate) max: i64,
    pub(crate) p50: i64,
    /// Reads that found at least this many running ([`RunningSamples::at_or_above`]).
    pub(crate) threshold: i64,
    pub(crate) at_or_above: usize,
}

impl RunningSamples {
    fn of(mut counts: Vec<i64>, threshold: i64) -> RunningSamples {
        counts.sort_unstable();
        RunningSamples {
            samples: counts.len(),
            max: counts.last().copied().unwrap_or(0),
            p50: counts.get(counts.len() / 2).copied().unwrap_or(0),
            threshold,
            at_or_above: counts.iter().filter(|c| **c >= threshold).count(),
        }
    }

    /// The share of the reads that found fewer than the threshold running.
    pub(crate) fn share_below(&self) -> f64 {
        1.0 - self.at_or_above as f64 / self.samples.max(1) as f64
    }
}

/// Rate-limited drains: starts counted by completion time (`finished_at`, database clock; a
/// no-op item completes within milliseconds of its start) in the window from one period after
/// the resume (the first period holds the full bucket's burst) to that plus the window.
#[derive(Clone, Debug)]
pub(crate) struct RateWindow {
    /// Starts per second the queue allows (`rate_limit / rate_period`).
    pub(crate) target_per_s: f64,
    pub(crate) window_s: f64,
    /// Items completed in the window.
    pub(crate) items: i64,
    /// `items / window_s`.
    pub(crate) per_s: f64,
    /// `per_s / target_per_s − 1`.
    pub(crate) deviation: f64,
    /// Items completed in the first period (the bucket's burst of `rate_limit` plus the
    /// period's refill).
    pub(crate) first_period: i64,
    /// Items completed from the resume to the window's end, and the most the bucket allows by
    /// then: `rate_limit` (the burst) plus the refill over that time.
    pub(crate) by_end: i64,
    pub(crate) allowed_by_end: f64,
    /// The fewest and the most items completed in one second of the window (a stall longer
    /// than the bucket holds loses starts for good: the bucket refills no further than full).
    pub(crate) second_min: i64,
    pub(crate) second_max: i64,
}

/// Keyed drains: from one item's completion to the next item's of the same key (ordering_seq
/// order), database clock. The next item is promoted in the transaction that completes the
/// one before, so with one key this is the promotion path's latency per item: the wake, the
/// claim, the handler and the completion.
#[derive(Clone, Debug)]
pub(crate) struct KeyGaps {
    pub(crate) gaps: i64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) max_ms: f64,
}

impl DrainRun {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "items": self.items,
            "ordering_keys": self.keys,
            "enqueue_items_per_s": self.enqueue_rate.round(),
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
            "key_gap_ms": self.key_gaps.as_ref().map(|g| json!({
                "gaps": g.gaps, "p50": g.p50_ms, "p90": g.p90_ms, "max": g.max_ms,
            })),
            "max_running": self.max_running,
            "running_sampled": self.running.as_ref().map(|r| json!({
                "samples": r.samples, "max": r.max, "p50": r.p50,
                "threshold": r.threshold, "at_or_above_threshold": r.at_or_above,
            })),
            "rate_window": self.rate_window.as_ref().map(|w| json!({
                "target_per_s": w.target_per_s, "window_s": w.window_s, "items": w.items,
                "per_s": (w.per_s * 10.0).round() / 10.0,
                "deviation": (w.deviation * 10_000.0).round() / 10_000.0,
                "first_period_items": w.first_period, "items_by_window_end": w.by_end,
                "allowed_by_window_end": w.allowed_by_end.floor(),
                "per_second_min": w.second_min, "per_second_max": w.second_max,
            })),
            "statements": self.statements.iter().take(12).map(|s| json!({
                "statement": setup::short_name(&s.query),
                "calls": s.calls,
                "rows": s.rows,
                "total_ms": (s.total_ms * 10.0).round() / 10.0,
            })).collect::<Vec<_>>(),
        })
    }
}

/// One drain of `shape`, on a fresh database.
pub(crate) async fn run_once(ctx: &Ctx, shape: &Shape) -> BenchResult<DrainRun> {
    let db = ctx.create_db("drain").await?;
    let result = drain(ctx, &db, shape, |_| None).await;
    db.drop_now().await?;
    result
}

/// [`run_once`] with something beside the drain: `open` gets the drain's database URL once
/// the workers are ready, and what it returns runs until the last item completes.
pub(crate) async fn run_once_beside(
    ctx: &Ctx,
    shape: &Shape,
    open: impl FnOnce(&str) -> Option<Beside>,
) -> BenchResult<DrainRun> {
    let db = ctx.create_db("drain").await?;
    let result = drain(ctx, &db, shape, open).await;
    db.drop_now().await?;
    result
}

async fn drain(
    ctx: &Ctx,
    db: &BenchDb,
    shape: &Shape,
    open: impl FnOnce(&str) -> Option<Beside>,
) -> BenchResult<DrainRun> {
    let (n, items) = (shape.workers, shape.items);
    db.set_paused(true).await?;
    let filling = Instant::now();
    fill_keyed(db, items, shape.payload(), shape.keys).await?;
    let enqueue_rate = items as f64 / filling.elapsed().as_secs_f64();
    set_limits(db, shape).await?;
    db.settle().await?;

    let spec =
        Spec::defaults().concurrency(shape.concurrency.unwrap_or(ctx.options.drain_concurrency));
    let (mut workers, startup) =
        worker::start_all(&ctx.worker_bin, db.url(), &spec, n, &ctx.logs, "drain").await?;
    // The workers declared the queue too: its limits must still be the shape's.
    check_limits(db, shape).await?;

    let beside = open(db.url());
    let sampler = if shape.sample_running {
        Some(Sampler::start(db.url()).await?)
    } else {
        None
    };
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
    let counts = match sampler {
        Some(sampler) => Some(sampler.stop().await?),
        None => None,
    };
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
        "{} SELECT extract(epoch FROM max(finished_at))::float8 FROM {SCHEMA}.work_all",
        setup::MARK
    ))
    .fetch_one(db.pool())
    .await?;
    let seconds = end - t0;
    let decile_rates = if shape.deciles {
        Some(decile_rates(db, items, t0).await?)
    } else {
        None
    };
    let key_gaps = match shape.keys {
        Some(_) => Some(key_gaps(db).await?),
        None => None,
    };
    let running = match counts {
        Some(counts) if counts.is_empty() => {
            return Err(
                "drain: the sampler never found an item running: nothing was measured".into(),
            )
        }
        Some(counts) => Some(RunningSamples::of(
            counts,
            i64::from(shape.max_running.unwrap_or(super::flow::FLEET_LIMIT)),
        )),
        None => None,
    };
    let rate_window = match shape.rate {
        Some((rate, window)) => Some(rate_window(db, t0, end, rate, window).await?),
        None => None,
    };
    let tick = ctx.ticks_per_second;
    Ok(DrainRun {
        workers: n,
        items,
        keys: shape.keys,
        enqueue_rate,
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
        key_gaps,
        max_running: shape.max_running,
        running,
        rate_window,
    })
}

/// Sets the shape's limits on the queue (unlimited when the shape has none): an operator's
/// change (`set_queue_settings`), which a worker's declaration of the queue without limits
/// does not undo (the workers are anonymous; docs/store.md). A rate set here starts with a
/// full bucket.
async fn set_limits(db: &BenchDb, shape: &Shape) -> BenchResult<()> {
    if shape.max_running.is_none() && shape.rate.is_none() {
        return Ok(());
    }
    let mut params = SetQueueSettingsParams::new(QUEUE);
    params.max_running = Some(shape.max_running);
    params.rate_limit = Some(shape.rate.map(|(rate, _)| rate));
    db.coordinator().set_queue_settings(params).await?;
    Ok(())
}

/// An error unless the queue's stored limits are the shape's.
async fn check_limits(db: &BenchDb, shape: &Shape) -> BenchResult<()> {
    let (max_running, rate_limit, period_ms): (Option<i32>, Option<i32>, Option<f64>) =
        sqlx::query_as(&format!(
            "{} SELECT max_running, rate_limit, (1000 * extract(epoch FROM rate_period))::float8
             FROM {SCHEMA}.queues WHERE name = $1",
            setup::MARK
        ))
        .bind(QUEUE)
        .fetch_one(db.pool())
        .await?;
    let want_max = shape.max_running.map(|m| m as i32);
    let want_rate = shape
        .rate
        .map(|(r, _)| (r.limit as i32, r.period.as_secs_f64() * 1_000.0));
    let got_rate = rate_limit.zip(period_ms);
    let rate_matches = match (want_rate, got_rate) {
        (None, None) => true,
        (Some((l, p)), Some((gl, gp))) => l == gl && (p - gp).abs() < 1e-6,
        _ => false,
    };
    if want_max != max_running || !rate_matches {
        return Err(format!(
            "drain: the queue's limits are max_running {max_running:?}, rate {got_rate:?} \
             once the workers started; the drain set {want_max:?}, {want_rate:?}"
        )
        .into());
    }
    Ok(())
}

/// Reads the queue's running count every [`SAMPLE_EVERY`] on its own connection, keeping the
/// counts from the first that found an item running.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    counts: Arc<Mutex<Vec<i64>>>,
    task: Option<tokio::task::JoinHandle<Result<(), String>>>,
}

impl Drop for Sampler {
    /// A drain that fails half-way stops its sampler too.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Sampler {
    async fn start(url: &str) -> BenchResult<Sampler> {
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()?
            .disable_statement_logging();
        let mut conn = sqlx::PgConnection::connect_with(&options).await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(Vec::new()));
        let (flag, out) = (stop.clone(), counts.clone());
        let sql = format!(
            "{} SELECT count(*)::int8 FROM {SCHEMA}.work_all WHERE queue = $1 AND state = 'running'",
            setup::MARK
        );
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut started = false;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let count = sqlx::query_scalar::<_, i64>(&sql)
                    .bind(QUEUE)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| format!("the running-count sampler: {e}"))?;
                started |= count > 0;
                if started {
                    out.lock().expect("not poisoned").push(count);
                }
            }
            let _ = conn.close().await;
            Ok(())
        });
        Ok(Sampler {
            stop,
            counts,
            task: Some(task),
        })
    }

    /// Stops the sampler and returns its counts; an error when a read failed (the counts
    /// would cover part of the drain only).
    async fn stop(mut self) -> BenchResult<Vec<i64>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let Some(task) = self.task.take() else {
            return Err("the running-count sampler was stopped twice".into());
        };
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error.into()),
            Ok(Err(error)) => return Err(format!("the running-count sampler: {error}").into()),
            Err(_) => return Err("the running-count sampler did not stop within 5 s".into()),
        }
        Ok(std::mem::take(
            &mut *self.counts.lock().expect("not poisoned"),
        ))
    }
}

/// The rate-limited drain's starts in its window ([`RateWindow`]); an error when the backlog
/// ran out before the window ended (the rate would be the backlog's, not the limit's).
async fn rate_window(
    db: &BenchDb,
    t0: f64,
    end: f64,
    rate: RateLimit,
    window: Duration,
) -> BenchResult<RateWindow> {
    let period = rate.period.as_secs_f64();
    let (from, to) = (t0 + period, t0 + period + window.as_secs_f64());
    if end < to {
        return Err(format!(
            "rate drain: the last item completed {:.1} s after the resume, before the window's end \
             ({:.1} s): add items",
            end - t0,
            to - t0
        )
        .into());
    }
    let (first_period, items, by_end): (i64, i64, i64) = sqlx::query_as(&format!(
        "{} SELECT count(*) FILTER (WHERE finished_at < to_timestamp($1))::int8,
                count(*) FILTER (WHERE finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2))::int8,
                count(*) FILTER (WHERE finished_at < to_timestamp($2))::int8
         FROM {SCHEMA}.work_all WHERE state = 'completed'",
        setup::MARK
    ))
    .bind(from)
    .bind(to)
    .fetch_one(db.pool())
    .await?;
    if items == 0 {
        return Err("rate drain: no item completed in the window: nothing was measured".into());
    }
    let (second_min, second_max): (i64, i64) = sqlx::query_as(&format!(
        "{} SELECT min(coalesce(n, 0))::int8, max(coalesce(n, 0))::int8
         FROM generate_series(0, $3 - 1) AS s(i)
         LEFT JOIN (SELECT floor(extract(epoch FROM finished_at) - $1)::int AS i, count(*) AS n
                    FROM {SCHEMA}.work_all
                    WHERE finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2)
                    GROUP BY 1) c USING (i)",
        setup::MARK
    ))
    .bind(from)
    .bind(to)
    .bind(window.as_secs() as i32)
    .fetch_one(db.pool())
    .await?;
    let target_per_s = f64::from(rate.limit) / period;
    let window_s = window.as_secs_f64();
    let per_s = items as f64 / window_s;
    Ok(RateWindow {
        target_per_s,
        window_s,
        items,
        per_s,
        deviation: per_s / target_per_s - 1.0,
        first_period,
        by_end,
        allowed_by_end: f64::from(rate.limit) + target_per_s * (to - t0),
        second_min,
        second_max,
    })
}

/// Enqueues `items` copies of `payload` in bulk calls of 10 000.
pub(crate) async fn fill(
    db: &BenchDb,
    items: usize,
    payload: serde_json::Value,
) -> BenchResult<()> {
    fill_keyed(db, items, payload, None).await
}

/// [`fill`], item `i` with ordering key `key-<i % n>` when `keys` is `Some(n)`.
pub(crate) async fn fill_keyed(
    db: &BenchDb,
    items: usize,
    payload: serde_json::Value,
    keys: Option<usize>,
) -> BenchResult<()> {
    let coordinator = db.coordinator();
    let mut done = 0;
    while done < items {
        let n = (items - done).min(FILL_BATCH);
        let batch = (done..done + n)
            .map(|i| {
                let item = NewWork::new(QUEUE, payload.clone());
                match keys {
                    Some(keys) => item.ordering_key(format!("key-{}", i % keys)),
                    None => item,
                }
            })
            .collect();
        coordinator
            .enqueue_work(EnqueueWorkParams { items: batch })
            .await?;
        done += n;
    }
    Ok(())
}

/// The completion gaps of a keyed drain ([`KeyGaps`]); an error when an item completed
/// before the item ahead of it in its key (the promise keys make), or when no key had two
/// items to compare.
async fn key_gaps(db: &BenchDb) -> BenchResult<KeyGaps> {
    let sql = format!(
        "{} SELECT count(*)::int8,
                count(*) FILTER (WHERE gap < interval '0')::int8,
                coalesce(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY gap)), 0)::float8,
                coalesce(1000 * extract(epoch FROM percentile_cont(0.9) WITHIN GROUP (ORDER BY gap)), 0)::float8,
                coalesce(1000 * extract(epoch FROM max(gap)), 0)::float8
         FROM (SELECT finished_at - lag(finished_at) OVER (PARTITION BY ordering_key ORDER BY ordering_seq) AS gap
               FROM {SCHEMA}.work_all WHERE ordering_key IS NOT NULL) g
         WHERE gap IS NOT NULL",
        setup::MARK
    );
    let (gaps, backwards, p50, p90, max): (i64, i64, f64, f64, f64) =
        sqlx::query_as(&sql).fetch_one(db.pool()).await?;
    if gaps == 0 {
        return Err("keyed drain: no key had two completed items to compare".into());
    }
    if backwards > 0 {
        return Err(format!(
            "keyed drain: {backwards} of {gaps} items completed before the item ahead of them in their key"
        )
        .into());
    }
    let round = |ms: f64| (ms * 1_000.0).round() / 1_000.0;
    Ok(KeyGaps {
        gaps,
        p50_ms: round(p50),
        p90_ms: round(p90),
        max_ms: round(max),
    })
}

/// Items per second in each tenth of the items (by completion time).
async fn decile_rates(db: &BenchDb, items: usize, t0: f64) -> BenchResult<Vec<f64>> {
    let sql = format!(
        "{} SELECT array_agg(extract(epoch FROM t)::float8 ORDER BY i)
         FROM unnest((SELECT percentile_disc(ARRAY[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0])
                      WITHIN GROUP (ORDER BY finished_at) FROM {SCHEMA}.work_all)) WITH ORDINALITY AS u(t, i)",
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

/// Drains of two shapes run alternately: the plain drain (`base`) and a variant, the two
/// drains of a pair back to back, which one goes first alternating between pairs
/// ([`Pairs::order`]), so that a machine that drifts favours neither.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pairs {
    pub(crate) base: Vec<DrainRun>,
    pub(crate) variant: Vec<DrainRun>,
}

impl Pairs {
    /// Pair `pair`'s order: `false` is the base, `true` the variant.
    pub(crate) fn order(pair: usize) -> [bool; 2] {
        if pair.is_multiple_of(2) {
            [false, true]
        } else {
            [true, false]
        }
    }

    pub(crate) fn push(&mut self, variant: bool, run: DrainRun) {
        if variant {
            self.variant.push(run);
        } else {
            self.base.push(run);
        }
    }

    /// The median rate of `runs`.
    pub(crate) fn median(runs: &[DrainRun]) -> f64 {
        let mut rates: Vec<f64> = runs.iter().map(|r| r.rate).collect();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    }

    /// The variant's median rate over the base's.
    pub(crate) fn ratio_of_medians(&self) -> f64 {
        Self::median(&self.variant) / Self::median(&self.base)
    }

    /// Each pair's ratio, variant over base, in the order they ran.
    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.variant
            .iter()
            .zip(&self.base)
            .map(|(v, b)| v.rate / b.rate)
            .collect()
    }

    /// The median of the pairs' ratios: the figure, as it discounts the machine's drift
    /// between pairs.
    pub(crate) fn ratio(&self) -> f64 {
        let mut ratios = self.ratios();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rate: f64) -> DrainRun {
        DrainRun {
            workers: 2,
            items: 100,
            keys: None,
            enqueue_rate: 1.0,
            rate,
            seconds: 100.0 / rate,
            startup_s: 0.0,
            wal_bytes_per_item: 0.0,
            server_cpu_s: None,
            worker_cpu_s: 0.0,
            other_cpu_s: None,
            statements: Vec::new(),
            decile_rates: None,
            key_gaps: None,
            max_running: None,
            running: None,
            rate_window: None,
        }
    }

    #[test]
    fn pairs_alternate_which_goes_first() {
        assert_eq!(Pairs::order(0), [false, true]);
        assert_eq!(Pairs::order(1), [true, false]);
        assert_eq!(Pairs::order(2), [false, true]);
    }

    #[test]
    fn the_pair_ratio_is_the_median_of_each_pairs_ratio() {
        let mut pairs = Pairs::default();
        // Pair ratios 0.5, 0.9, 0.8 on a drifting machine: 0.8; the ratio of the medians 0.5.
        for (base, variant) in [(100.0, 50.0), (50.0, 45.0), (200.0, 160.0)] {
            pairs.push(false, run(base));
            pairs.push(true, run(variant));
        }
        assert_eq!(pairs.ratios(), vec![0.5, 0.9, 0.8]);
        assert!((pairs.ratio() - 0.8).abs() < 1e-12);
        assert!((pairs.ratio_of_medians() - 50.0 / 100.0).abs() < 1e-12);
    }

    #[test]
    fn running_samples_count_the_reads_at_or_above_the_limit() {
        let samples = RunningSamples::of(vec![50, 3, 49, 50, 12], 50);
        assert_eq!(samples.samples, 5);
        assert_eq!(samples.max, 50);
        assert_eq!(samples.p50, 49);
        assert_eq!(samples.at_or_above, 2);
        assert!((samples.share_below() - 0.6).abs() < 1e-12);
    }
}
