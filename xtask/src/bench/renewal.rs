//! Renewal write volume and memory: one worker holding 10 000 in-flight `sleep` items under
//! a 3 s lease (renewal every 1 s), concurrency 10 000. Over a window the database counts
//! the statements (pg_stat_statements; pg_stat_user_functions as a cross-check) and the rows
//! renewed (the growth of `sum(renewals)`); `/proc/<pid>/status` gives the worker's peak RSS.

use std::time::{Duration, Instant};

use serde_json::json;

use super::drain::fill;
use super::setup::{self, BenchDb, Statement, SCHEMA};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};

/// The lease of the renewal scenario; the renewal interval is a third of it.
pub(crate) const LEASE_MS: u64 = 3_000;

#[derive(Clone, Debug)]
pub(crate) struct Renewal {
    /// Whether the work table was analyzed once every item ran (the planner then knows about
    /// the running rows); otherwise its statistics are from before the claims (an idle queue).
    pub(crate) warm_stats: bool,
    pub(crate) in_flight: usize,
    pub(crate) window_s: f64,
    pub(crate) renew_statements_per_min: f64,
    pub(crate) renew_rows_per_min: f64,
    pub(crate) heartbeat_statements_per_min: f64,
    /// Every statement the worker sent, per minute.
    pub(crate) all_statements_per_min: f64,
    /// Items that lost the lease of their first claim in the window, per minute: every item
    /// runs at its first attempt when the window opens and sleeps past its end, so an item
    /// that is no longer running or runs a later attempt when it closes lost a lease (its
    /// handler's fence fired and it failed or was released, or the maintenance sweep
    /// released the lapsed lease), whether or not it was claimed again.
    pub(crate) failed_items_per_min: f64,
    /// Items that had lost the lease of their first claim when the window opened: in the
    /// claims or the two renewal intervals of settling before it (the same test).
    pub(crate) lost_before_window: i64,
    /// The same counts from pg_stat_user_functions (they lag up to about a second).
    pub(crate) renew_function_calls_per_min: f64,
    pub(crate) heartbeat_function_calls_per_min: f64,
    pub(crate) statements: Vec<Statement>,
    /// Peak and current RSS in MB, and the RSS when ready (before claiming).
    pub(crate) rss_peak_mb: f64,
    pub(crate) rss_mb: f64,
    pub(crate) rss_idle_mb: f64,
    pub(crate) worker_cpu_per_s: f64,
    /// WAL written in the window per renewed row (the whole database's WAL: the worker's
    /// other statements are a few per minute).
    pub(crate) wal_bytes_per_renewal: f64,
}

impl Renewal {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "warm_stats": self.warm_stats,
            "in_flight": self.in_flight,
            "renew_statements_per_min": self.renew_statements_per_min.round(),
            "renew_rows_per_min": self.renew_rows_per_min.round(),
            "heartbeat_statements_per_min": self.heartbeat_statements_per_min,
            "failed_items_per_min": self.failed_items_per_min.round(),
            "lost_before_window": self.lost_before_window,
            "rss_mb_peak": self.rss_peak_mb,
            "window_s": self.window_s,
            "all_statements_per_min": self.all_statements_per_min.round(),
            "renew_function_calls_per_min": self.renew_function_calls_per_min.round(),
            "heartbeat_function_calls_per_min": self.heartbeat_function_calls_per_min,
            "rss_mb_when_ready": self.rss_idle_mb,
            "rss_mb_at_end": self.rss_mb,
            "worker_cpu_s_per_s": self.worker_cpu_per_s,
            "wal_bytes_per_renewal": self.wal_bytes_per_renewal.round(),
            "statements": self.statements.iter().take(10).map(|s| json!({
                "statement": setup::short_name(&s.query),
                "calls": s.calls,
                "rows": s.rows,
                "total_ms": (s.total_ms * 10.0).round() / 10.0,
            })).collect::<Vec<_>>(),
        })
    }
}

/// One window. `warm_stats`: `ANALYZE` the work table once all items run (as autovacuum
/// eventually would), so the plans see the running rows; without it the statistics are the
/// idle queue's, taken before the claims.
pub(crate) async fn run(ctx: &Ctx, warm_stats: bool) -> BenchResult<Renewal> {
    let db = ctx.create_db("renewal").await?;
    let result = measure(ctx, &db, warm_stats).await;
    db.drop_now().await?;
    result
}

async fn measure(ctx: &Ctx, db: &BenchDb, warm_stats: bool) -> BenchResult<Renewal> {
    let items = ctx.plan.renewal_items;
    let window = ctx.plan.renewal_window;
    // Long enough to outlast the claims, the settling and the window.
    let sleep_ms = (window + Duration::from_secs(180)).as_millis() as u64;
    db.set_paused(true).await?;
    fill(db, items, json!({ "kind": "sleep", "ms": sleep_ms })).await?;
    db.settle().await?;
    let spec = Spec::defaults().concurrency(items).lease_ms(LEASE_MS);
    let (mut workers, _) =
        worker::start_all(&ctx.worker_bin, db.url(), &spec, 1, &ctx.logs, "renewal").await?;
    let pid = workers.pid(0);
    let rss_idle_kb = setup::status_kb(pid, "VmRSS").unwrap_or(0);
    db.set_paused(false).await?;

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if db.count("state = 'running'").await? >= items as i64 {
            break;
        }
        workers.check_alive()?;
        if Instant::now() > deadline {
            return Err(format!("renewal: {items} items not all running after 60 s").into());
        }
    }
    if warm_stats {
        sqlx::raw_sql(&format!("ANALYZE {SCHEMA}.work"))
            .execute(db.pool())
            .await?;
    }
    // Two renewal intervals for the renewals to spread into their steady rhythm.
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS / 3 + 500)).await;

    let renewals = format!(
        "{} SELECT coalesce(sum(renewals), 0)::int8 FROM {SCHEMA}.work_all",
        setup::MARK
    );
    let lost = format!(
        "{} SELECT count(*) FROM {SCHEMA}.work_all WHERE state <> 'running' OR attempt > 1",
        setup::MARK
    );
    let lost_before: i64 = sqlx::query_scalar(&lost).fetch_one(db.pool()).await?;
    let stmts_before = db.statements().await?;
    let funcs_before = db.function_calls().await?;
    let renewals_before: i64 = sqlx::query_scalar(&renewals).fetch_one(db.pool()).await?;
    let cpu_before = workers.cpu_ticks();
    let wal_before = db.wal_bytes().await?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let stmts_after = db.statements().await?;
    let renewals_after: i64 = sqlx::query_scalar(&renewals).fetch_one(db.pool()).await?;
    let lost_after: i64 = sqlx::query_scalar(&lost).fetch_one(db.pool()).await?;
    let wal_after = db.wal_bytes().await?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = workers.cpu_ticks();
    workers.check_alive()?;
    let rss_peak_kb = setup::status_kb(pid, "VmHWM").unwrap_or(0);
    let rss_kb = setup::status_kb(pid, "VmRSS").unwrap_or(0);
    // Function counters lag by up to a second: read them a little later (the ratio uses the
    // same window length).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let funcs_after = db.function_calls().await?;
    workers.kill_all().await;

    let per_min = |n: f64| n * 60.0 / elapsed;
    let stmts = match (stmts_after, stmts_before) {
        (Some(after), Some(before)) => after.since(&before),
        _ => Vec::new(),
    };
    let func = |name: &str| {
        (funcs_after.get(name).copied().unwrap_or(0) - funcs_before.get(name).copied().unwrap_or(0))
            as f64
    };
    let (renew_calls, _, _) = setup::sum_matching(&stmts, ".renew_leases(");
    let (heartbeat_calls, _, _) = setup::sum_matching(&stmts, ".record_heartbeat(");
    let all: i64 = stmts.iter().map(|s| s.calls).sum();
    let (renew_calls, heartbeat_calls) = if db.has_statements() {
        (renew_calls as f64, heartbeat_calls as f64)
    } else {
        (func("renew_leases"), func("record_heartbeat"))
    };
    Ok(Renewal {
        warm_stats,
        in_flight: items,
        failed_items_per_min: per_min((lost_after - lost_before) as f64),
        lost_before_window: lost_before,
        window_s: elapsed,
        renew_statements_per_min: per_min(renew_calls),
        renew_rows_per_min: per_min((renewals_after - renewals_before) as f64),
        heartbeat_statements_per_min: per_min(heartbeat_calls),
        all_statements_per_min: per_min(all as f64),
        renew_function_calls_per_min: per_min(func("renew_leases")),
        heartbeat_function_calls_per_min: per_min(func("record_heartbeat")),
        statements: stmts,
        rss_peak_mb: rss_peak_kb as f64 / 1024.0,
        rss_mb: rss_kb as f64 / 1024.0,
        rss_idle_mb: rss_idle_kb as f64 / 1024.0,
        wal_bytes_per_renewal: (wal_after - wal_before)
            / ((renewals_after - renewals_before).max(1) as f64),
        worker_cpu_per_s: (cpu_after - cpu_before) as f64 / ctx.ticks_per_second / elapsed,
    })
}
