//! Fleet upkeep (issue 16, "a queue that does not slow as it deepens"; docs/performance.md,
//! *Fleet upkeep*): what the maintenance sweeps of a fleet of [`INSTANCES`] instances cost
//! the server over a deep store, at the shipped intervals. The statements whose reads grow
//! with the store — `maintenance_due` (its look for lapsed leases visits every running row),
//! `queue_depth` (counts every waiting item) and `ordering_repair` (reads every blocked item)
//! — are sent at the rate the fleet sends them, from one process: each instance calls
//! `maintenance_due` every sweep interval, `queue_depth` every depth-sample interval and
//! `ordering_repair` every repair interval, so the fleet calls each [`INSTANCES`] times as
//! often. Twice, in the same run: with the fleet's turns as the sweep passes them (half of
//! each interval), and with every call taking its turn (zero: what each instance did on its
//! own before the turns). The figure is the server time of those statements per second of
//! the window (pg_stat_statements).

use std::time::{Duration, Instant};

use serde_json::json;
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, InstanceId, MaintenanceDueParams, OrderingRepairParams,
    QueueDepthParams, RecordHeartbeatParams, WorkCoordinator,
};
use workpump_host::MaintenanceConfig;

use super::drain;
use super::setup::{self, BenchDb, Statement, QUEUE};
use super::{BenchResult, Ctx};

/// The fleet whose sweeps are sent.
pub(crate) const INSTANCES: u32 = 50;
/// Items in flight under a live owner's long lease (the rows the look for lapsed leases
/// visits).
const RUNNING: u32 = 1_000;
/// Keyed items: ten a key, so nine tenths of them wait blocked behind their key's head.
const KEYED_PER_KEY: usize = 10;
/// The statements sent, as `setup::short_name` names them.
const STATEMENTS: [&str; 3] = ["maintenance_due", "queue_depth", "ordering_repair"];

/// One window of the fleet's upkeep.
#[derive(Clone, Debug)]
pub(crate) struct Side {
    /// Whether the calls passed the sweep's turn periods (else zero: every call takes its
    /// turn).
    pub(crate) turns: bool,
    pub(crate) window_s: f64,
    /// Server time of the three statements per second of the window, ms.
    pub(crate) ms_per_s: f64,
    /// Calls, server ms and mean ms of each statement.
    pub(crate) statements: Vec<(String, i64, f64)>,
}

impl Side {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "turns": self.turns,
            "window_s": self.window_s,
            "ms_per_s": self.ms_per_s,
            "statements": self.statements.iter().map(|(name, calls, ms)| json!({
                "statement": name,
                "calls": calls,
                "total_ms": ms,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Both windows, on one store.
#[derive(Clone, Debug)]
pub(crate) struct Upkeep {
    pub(crate) available: usize,
    pub(crate) keyed: usize,
    pub(crate) every_call: Side,
    pub(crate) turns: Side,
}

impl Upkeep {
    /// Turns over every call: what the turns leave of the fleet's upkeep.
    pub(crate) fn ratio(&self) -> f64 {
        self.turns.ms_per_s / self.every_call.ms_per_s
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "instances": INSTANCES,
            "available": self.available,
            "keyed": self.keyed,
            "running": RUNNING,
            "every_call": self.every_call.to_json(),
            "turns": self.turns.to_json(),
        })
    }
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<Upkeep> {
    let db = ctx.create_db("upkeep").await?;
    let result = measure(ctx, &db).await;
    db.drop_now().await?;
    result
}

async fn measure(ctx: &Ctx, db: &BenchDb) -> BenchResult<Upkeep> {
    if !db.has_statements() {
        return Err("upkeep needs pg_stat_statements on the server".into());
    }
    let (available, keyed) = (ctx.plan.upkeep_available, ctx.plan.upkeep_keyed);
    drain::fill(db, available, json!({ "kind": "noop" })).await?;
    drain::fill_keyed(
        db,
        keyed,
        json!({ "kind": "noop" }),
        Some(keyed / KEYED_PER_KEY),
    )
    .await?;
    let c = db.coordinator();
    let owner = InstanceId::new();
    // An owner that stays registered through both windows (nothing here reaps it).
    c.record_heartbeat(RecordHeartbeatParams {
        instance: owner,
        host: "bench".into(),
        metadata: json!({}),
        stale_after: Duration::from_secs(24 * 3600),
        dead_after: None,
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await?;
    let claimed = c
        .claim_work(ClaimWorkParams {
            instance: owner,
            queues: vec![QUEUE.into()],
            max_items: RUNNING,
            lease: Duration::from_secs(24 * 3600),
            async_commit: false,
        })
        .await?;
    if claimed.items.len() != RUNNING as usize {
        return Err(format!("claimed {} items, not {RUNNING}", claimed.items.len()).into());
    }
    db.settle().await?;
    // Every call takes its turn first, so that the turns' window does not start on turns the
    // first window took.
    let every_call = window(ctx, db, false).await?;
    let turns = window(ctx, db, true).await?;
    Ok(Upkeep {
        available,
        keyed,
        every_call,
        turns,
    })
}

/// The fleet's calls for one window: each statement on its own task, at its own cadence.
async fn window(ctx: &Ctx, db: &BenchDb, turns: bool) -> BenchResult<Side> {
    let config = MaintenanceConfig::default();
    let sweep = Duration::from_millis(config.interval_ms);
    let depth = Duration::from_millis(config.depth_sample_interval_ms);
    let repair = Duration::from_millis(config.ordering_repair_interval_ms);
    // What the sweep passes: half of each interval (crates/maintenance/src/worker.rs).
    let turn = |every: Duration| if turns { every / 2 } else { Duration::ZERO };
    let due = MaintenanceDueParams {
        judge: None,
        stale_after: Duration::from_secs(30),
        dead_after: None,
        lock_grace: None,
        completed_retention: Duration::from_millis(config.completed_retention_ms),
        dead_retention: Duration::from_millis(config.dead_retention_ms),
        evicted_retention: Duration::from_millis(config.evicted_retention_ms),
        lapsed_look_every: turn(sweep),
    };
    let depth_params = QueueDepthParams {
        max_age: turn(depth),
    };
    let repair_params = OrderingRepairParams {
        limit: config.batch_limit,
        every: turn(repair),
    };
    let until = Instant::now() + ctx.plan.upkeep_window;
    let before = db.statements().await?.ok_or("no pg_stat_statements")?;
    let started = Instant::now();
    let c = db.coordinator();
    let (a, b, d) = tokio::join!(
        every(until, sweep / INSTANCES, || c.maintenance_due(due)),
        every(until, depth / INSTANCES, || c.queue_depth(depth_params)),
        every(until, repair / INSTANCES, || c
            .ordering_repair(repair_params)),
    );
    a?;
    b?;
    d?;
    let elapsed = started.elapsed().as_secs_f64();
    let after = db.statements().await?.ok_or("no pg_stat_statements")?;
    let since: Vec<Statement> = after.since(&before);
    let mut statements = Vec::new();
    let mut total_ms = 0.0;
    for name in STATEMENTS {
        let (calls, _, ms) = setup::sum_matching(&since, &format!(".{name}("));
        if calls == 0 {
            return Err(format!("upkeep: no {name} call was counted").into());
        }
        total_ms += ms;
        statements.push((name.to_owned(), calls, ms));
    }
    Ok(Side {
        turns,
        window_s: elapsed,
        ms_per_s: total_ms / elapsed,
        statements,
    })
}

/// Calls `call` every `period` until `until` (a late call delays the next, as a sweep would).
async fn every<T, F, Fut>(until: Instant, period: Duration, mut call: F) -> BenchResult<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = workpump_coordinator::Result<T>>,
{
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if Instant::now() >= until {
            return Ok(());
        }
        call().await?;
    }
}
