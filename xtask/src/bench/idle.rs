//! Idle cost: what 4 idle workers (empty queue, default settings) send per second, with the
//! LISTEN connection healthy and with it off (`WORKPUMP_CLAIM__LISTEN=false`, which the NOTIFY
//! gate sees as "listener down"). Counted by pg_stat_statements over the window; committed
//! transactions from pg_stat_database as a cross-check.

use std::time::{Duration, Instant};

use serde_json::json;

use super::setup::{self, Statement};
use super::worker::{self, Spec};
use super::{BenchResult, Ctx};

/// Idle workers.
pub(crate) const WORKERS: usize = 4;

#[derive(Clone, Debug)]
pub(crate) struct Idle {
    pub(crate) listener: bool,
    pub(crate) window_s: f64,
    /// All 4 workers together.
    pub(crate) statements_per_s: f64,
    pub(crate) xact_commit_per_s: f64,
    pub(crate) statements: Vec<Statement>,
}

impl Idle {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "listener": self.listener,
            "workers": WORKERS,
            "window_s": self.window_s,
            "statements_per_s": self.statements_per_s,
            "statements_per_s_per_instance": self.statements_per_s / WORKERS as f64,
            "xact_commit_per_s": self.xact_commit_per_s,
            "statements": self.statements.iter().map(|s| json!({
                "statement": setup::short_name(&s.query),
                "calls": s.calls,
            })).collect::<Vec<_>>(),
        })
    }
}

pub(crate) async fn run(ctx: &Ctx, listener: bool) -> BenchResult<Idle> {
    let db = ctx.create_db("idle").await?;
    let mut spec = Spec::defaults();
    if !listener {
        spec = spec.settings(&[("claim.listen", "false")]);
    }
    let (mut workers, _) =
        worker::start_all(&ctx.worker_bin, db.url(), &spec, WORKERS, &ctx.logs, "idle").await?;
    // Past the start-up: first polls, registration, the poll backoff reaching its cap.
    tokio::time::sleep(ctx.plan.idle_settle).await;
    let stmts_before = db.statements().await?;
    let xacts_before = db.xact_commit().await?;
    let started = Instant::now();
    tokio::time::sleep(ctx.plan.idle_window).await;
    let stmts_after = db.statements().await?;
    let elapsed = started.elapsed().as_secs_f64();
    // pg_stat_database lags (idle backends flush at most every 10 s): read it after a pause.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let xacts_after = db.xact_commit().await?;
    workers.check_alive()?;
    workers.terminate(Duration::from_secs(10)).await;
    db.drop_now().await?;
    let stmts = match (stmts_after, stmts_before) {
        (Some(after), Some(before)) => {
            let mut s = after.since(&before);
            s.sort_by_key(|b| std::cmp::Reverse(b.calls));
            s
        }
        _ => Vec::new(),
    };
    let calls: i64 = stmts.iter().map(|s| s.calls).sum();
    let statements_per_s = if stmts.is_empty() {
        (xacts_after - xacts_before) as f64 / elapsed
    } else {
        calls as f64 / elapsed
    };
    Ok(Idle {
        listener,
        window_s: elapsed,
        statements_per_s,
        xact_commit_per_s: (xacts_after - xacts_before) as f64 / elapsed,
        statements: stmts,
    })
}
