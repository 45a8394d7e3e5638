//! Fleet-wide limits per queue (issue 15; docs/flow-control.md).
//!
//! `fleet-limit`: `max_running = 50` on the queue, two questions, each answered by pairs of
//! drains (unlimited, limited) run alternately ([`Pairs`]) with the queue's running count
//! sampled beside every drain:
//! - **bound**: 20 ms handlers, the drain's concurrency (2 000 handlers a worker), so the
//!   unlimited drain runs far more than 50 at once: the limited drain's sampled running count
//!   must never exceed 50 and must reach it (else the check would be vacuous);
//! - **free**: no-op handlers and 48 handlers over the workers, so the unlimited drain never
//!   has 50 running and the limit is not the bottleneck: the limited drain's rate over the
//!   unlimited one's is what the limit's bookkeeping costs (claims of a limited queue lock its
//!   row, count its running items and mark the rows they lease).
//!
//! `rate`: `rate_limit = 1 000` per second on the queue, a backlog of 1 000 × (window + 10 s)
//! no-op items and workers at the drain's concurrency (unlimited, they drain many times
//! faster); the starts (completions, on the database clock) over the window that begins one
//! period after the resume (the first period holds the full bucket's burst) against 1 000/s.

use std::time::Duration;

use serde_json::json;
use workpump_coordinator::RateLimit;

use super::drain::{self, DrainRun, Pairs, Shape};
use super::{BenchResult, Ctx};

/// The fleet-wide running limit the bench sets.
pub(crate) const FLEET_LIMIT: u32 = 50;
/// Handler time of the bound drains, ms: the unlimited drain then has thousands running.
pub(crate) const BOUND_HANDLER_MS: u64 = 20;
/// Items of each bound drain: 50 at a time for 20 ms each is at most 2 500/s, so 4 s or more.
pub(crate) const BOUND_ITEMS: usize = 10_000;
/// Handlers over all the workers of the free drains: below the limit, so it never binds.
pub(crate) const FREE_HANDLERS: usize = 48;
/// Items of each free drain.
pub(crate) const FREE_ITEMS: usize = 30_000;
/// The rate limit the bench sets: starts per period.
pub(crate) const RATE: u32 = 1_000;
/// Its period.
pub(crate) const RATE_PERIOD: Duration = Duration::from_secs(1);

/// The fleet-limit drains.
#[derive(Clone, Debug)]
pub(crate) struct FleetLimit {
    pub(crate) workers: usize,
    /// Bound: unlimited (base) and limited (variant) drains of 20 ms items.
    pub(crate) bound: Pairs,
    /// Free: unlimited (base) and limited (variant) drains of no-op items, 48 handlers.
    pub(crate) free: Pairs,
    /// Handlers per worker in the free drains.
    pub(crate) free_concurrency: usize,
}

impl FleetLimit {
    /// The highest running count sampled in any of `runs`.
    pub(crate) fn max_running(runs: &[DrainRun]) -> Option<i64> {
        runs.iter()
            .filter_map(|r| r.running.as_ref())
            .map(|s| s.max)
            .max()
    }

    /// The smallest share of samples below the limit over `runs`.
    pub(crate) fn share_below(runs: &[DrainRun]) -> Option<f64> {
        runs.iter()
            .filter_map(|r| r.running.as_ref())
            .map(|s| s.share_below())
            .min_by(f64::total_cmp)
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let ratios = |p: &Pairs| {
            p.ratios()
                .iter()
                .map(|r| (r * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>()
        };
        json!({
            "workers": self.workers,
            "limit": FLEET_LIMIT,
            "bound": {
                "handler_ms": BOUND_HANDLER_MS,
                "items": BOUND_ITEMS,
                "pair_ratios": ratios(&self.bound),
                "unlimited_runs": self.bound.base.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
                "limited_runs": self.bound.variant.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            },
            "free": {
                "handlers_per_worker": self.free_concurrency,
                "items": FREE_ITEMS,
                "pair_ratios": ratios(&self.free),
                "unlimited_runs": self.free.base.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
                "limited_runs": self.free.variant.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            },
        })
    }
}

/// The bound pairs, then the free pairs, each drain by `workers` processes.
pub(crate) async fn fleet_limit(ctx: &Ctx, workers: usize) -> BenchResult<FleetLimit> {
    let bound_items = if ctx.options.quick {
        BOUND_ITEMS / 2
    } else {
        BOUND_ITEMS
    };
    let free_items = if ctx.options.quick {
        FREE_ITEMS / 3
    } else {
        FREE_ITEMS
    };
    let bound = Shape::plain(workers, bound_items)
        .handler_ms(BOUND_HANDLER_MS)
        .sample_running();
    let free_concurrency = (FREE_HANDLERS / workers).max(1);
    let free = Shape::plain(workers, free_items)
        .concurrency(free_concurrency)
        .sample_running();
    let mut out = FleetLimit {
        workers,
        bound: Pairs::default(),
        free: Pairs::default(),
        free_concurrency,
    };
    for (label, shape, pairs) in [
        ("bound", &bound, &mut out.bound),
        ("free", &free, &mut out.free),
    ] {
        let limited = shape.clone().max_running(FLEET_LIMIT);
        for pair in 0..ctx.plan.fleet_limit_pairs {
            for variant in Pairs::order(pair) {
                let run = drain::run_once(ctx, if variant { &limited } else { shape }).await?;
                let sampled = run.running.clone().unwrap_or_default();
                eprintln!(
                    "bench: fleet limit, {label}, {}, {workers} worker(s), pair {}/{}: {:.0} items/s; running sampled {} times: max {}, p50 {}, {:.0} % below {FLEET_LIMIT}",
                    if variant { "limited to 50" } else { "unlimited" },
                    pair + 1,
                    ctx.plan.fleet_limit_pairs,
                    run.rate,
                    sampled.samples,
                    sampled.max,
                    sampled.p50,
                    100.0 * sampled.share_below(),
                );
                pairs.push(variant, run);
            }
        }
    }
    Ok(out)
}

/// The rate-limited drains.
#[derive(Clone, Debug)]
pub(crate) struct Rate {
    pub(crate) workers: usize,
    pub(crate) runs: Vec<DrainRun>,
}

impl Rate {
    /// The median of the runs' rates in their windows, and that run's deviation.
    pub(crate) fn median(&self) -> Option<(f64, f64)> {
        let mut windows: Vec<_> = self
            .runs
            .iter()
            .filter_map(|r| r.rate_window.as_ref())
            .collect();
        windows.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
        windows
            .get(windows.len() / 2)
            .map(|w| (w.per_s, w.deviation))
    }

    /// The largest deviation of any run, either way.
    pub(crate) fn worst_deviation(&self) -> Option<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.rate_window.as_ref())
            .map(|w| w.deviation)
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
    }

    /// The most any run completed from the resume to its window's end over what the bucket
    /// allows by then (its burst and its refill): at most 1.
    pub(crate) fn bucket_use(&self) -> Option<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.rate_window.as_ref())
            .map(|w| w.by_end as f64 / w.allowed_by_end)
            .max_by(f64::total_cmp)
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "rate_limit": RATE,
            "rate_period_ms": RATE_PERIOD.as_millis() as u64,
            "runs": self.runs.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The rate-limited drains, by `workers` processes at the drain's concurrency.
pub(crate) async fn rate(ctx: &Ctx, workers: usize) -> BenchResult<Rate> {
    let window = ctx.plan.rate_window;
    let items = RATE as usize * (window.as_secs() as usize + 10);
    let shape = Shape::plain(workers, items).rate(RateLimit::new(RATE, RATE_PERIOD), window);
    let mut runs = Vec::new();
    for i in 0..ctx.plan.rate_runs {
        let run = drain::run_once(ctx, &shape).await?;
        if let Some(w) = &run.rate_window {
            eprintln!(
                "bench: rate limit {RATE}/s, {workers} worker(s), run {}/{}: {:.1} starts/s over {:.0} s ({:+.2} %); first second {}; {} by the window's end, the bucket allows {:.0}; per second {}–{}",
                i + 1,
                ctx.plan.rate_runs,
                w.per_s,
                w.window_s,
                100.0 * w.deviation,
                w.first_period,
                w.by_end,
                w.allowed_by_end.floor(),
                w.second_min,
                w.second_max
            );
        }
        runs.push(run);
    }
    Ok(Rate { workers, runs })
}
