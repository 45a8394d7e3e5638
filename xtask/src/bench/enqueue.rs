//! Enqueue: single items (`PgCoordinator::enqueue_work` with one item, one transaction each)
//! from 1 and from 16 concurrent producers, bulk batches of 1 000 from one producer, and
//! single items in 16 producers' own transactions, the wake in the commit
//! (`PgCoordinator::enqueue_with`) and after it (`enqueue_deferring_wake`, then `wake`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use workpump_coordinator::{EnqueueWorkParams, NewWork, PgCoordinator, WorkCoordinator};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::ConnectOptions;

use super::setup::{self, QUEUE};
use super::{BenchResult, Ctx};

/// Items per bulk call.
pub(crate) const BULK_BATCH: usize = 1_000;

/// Items per second of each way to enqueue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EnqueueRates {
    pub(crate) single_1: f64,
    pub(crate) single_16: f64,
    pub(crate) bulk: f64,
    /// Single items from 1 producer on a pool that does not ping a connection before handing
    /// it out (`test_before_acquire(false)`; sqlx pings by default: one more round trip).
    pub(crate) single_1_no_ping: f64,
    /// CPU the bench process (the producer, a debug build) spent per item, µs.
    pub(crate) producer_cpu_us_single_1: f64,
    pub(crate) producer_cpu_us_bulk: f64,
    /// WAL the bulk producer's calls wrote, bytes per item (the whole cluster's WAL over the
    /// window: nothing else writes meanwhile).
    pub(crate) bulk_wal_bytes_per_item: f64,
    /// Single items from 16 producers, each in a transaction of the producer's that the
    /// enqueue notifies in (`enqueue_with`: the commit takes the notification lock).
    pub(crate) tx_16_notify: f64,
    /// The same, the wake sent after the commit (`enqueue_deferring_wake`, then `wake`).
    pub(crate) tx_16_deferred: f64,
    /// Wake statements sent per item by the 16 single-item producers (`single_16`, then
    /// `tx_16_deferred`): 1 when every producer sends its own, fewer when they share them.
    /// `None` without pg_stat_statements.
    pub(crate) wakes_per_item_single_16: Option<f64>,
    pub(crate) wakes_per_item_tx_16_deferred: Option<f64>,
}

/// How a producer enqueues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// `enqueue_work`: a transaction of its own, the wake after its commit.
    Pool,
    /// In the producer's transaction, notifying in it (`enqueue_with`).
    TxNotify,
    /// In the producer's transaction, the wake after its commit.
    TxDeferred,
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<EnqueueRates> {
    let window = ctx.plan.enqueue_window;
    let db = ctx.create_db("enqueue").await?;
    let coordinator = db.coordinator();
    db.settle().await?;
    let (single_1, producer_cpu_us_single_1, _) =
        producers(&coordinator, 1, 1, Way::Pool, window).await?;
    db.settle().await?;
    let before = db.statements().await?;
    let (single_16, _, single_16_items) = producers(&coordinator, 16, 1, Way::Pool, window).await?;
    let wakes_per_item_single_16 = wakes_per_item(&db, before, single_16_items).await?;
    db.settle().await?;
    let (tx_16_notify, _, _) = producers(&coordinator, 16, 1, Way::TxNotify, window).await?;
    db.settle().await?;
    let before = db.statements().await?;
    let (tx_16_deferred, _, tx_16_deferred_items) =
        producers(&coordinator, 16, 1, Way::TxDeferred, window).await?;
    let wakes_per_item_tx_16_deferred = wakes_per_item(&db, before, tx_16_deferred_items).await?;
    db.settle().await?;
    let wal_before = db.wal_bytes().await?;
    let (bulk, producer_cpu_us_bulk, bulk_items) =
        producers(&coordinator, 1, BULK_BATCH, Way::Pool, window).await?;
    let wal_after = db.wal_bytes().await?;
    db.settle().await?;
    let options: PgConnectOptions = db.url().parse()?;
    let no_ping = PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .connect_with(options.disable_statement_logging())
        .await?;
    let (single_1_no_ping, _, _) = producers(
        &PgCoordinator::new(no_ping.clone()),
        1,
        1,
        Way::Pool,
        window,
    )
    .await?;
    no_ping.close().await;
    db.drop_now().await?;
    Ok(EnqueueRates {
        single_1,
        single_16,
        bulk,
        single_1_no_ping,
        producer_cpu_us_single_1,
        producer_cpu_us_bulk,
        bulk_wal_bytes_per_item: ((wal_after - wal_before) / bulk_items.max(1.0)).round(),
        tx_16_notify,
        tx_16_deferred,
        wakes_per_item_single_16,
        wakes_per_item_tx_16_deferred,
    })
}

/// Wake statements (`sql/queries/wake_queues.sql`: `pg_notify`) since `before`, per item of
/// the `items` enqueued meanwhile.
async fn wakes_per_item(
    db: &setup::BenchDb,
    before: Option<setup::Statements>,
    items: f64,
) -> BenchResult<Option<f64>> {
    let (Some(before), Some(after)) = (before, db.statements().await?) else {
        return Ok(None);
    };
    let (wakes, _, _) = setup::sum_matching(&after.since(&before), "pg_notify(");
    Ok(Some(wakes as f64 / items.max(1.0)))
}

/// `producers` tasks each enqueue batches of `batch` items back to back for `window`, the
/// `way` given; returns items per second, this process's CPU µs per item and the items
/// enqueued.
async fn producers(
    coordinator: &PgCoordinator,
    producers: usize,
    batch: usize,
    way: Way,
    window: Duration,
) -> BenchResult<(f64, f64, f64)> {
    let cpu_before = setup::cpu_ticks(std::process::id()).unwrap_or(0);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let stop_at = started + window;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..producers {
        let coordinator = coordinator.clone();
        let done = done.clone();
        tasks.spawn(async move {
            while Instant::now() < stop_at {
                let items = (0..batch)
                    .map(|_| NewWork::new(QUEUE, json!({ "kind": "noop" })))
                    .collect();
                let params = EnqueueWorkParams { items };
                match way {
                    Way::Pool => {
                        coordinator.enqueue_work(params).await?;
                    }
                    Way::TxNotify => {
                        let mut tx = coordinator.begin_transaction().await?;
                        coordinator.enqueue_with(&mut tx, params).await?;
                        coordinator.commit_transaction(tx).await?;
                    }
                    Way::TxDeferred => {
                        let mut tx = coordinator.begin_transaction().await?;
                        let (_, wake) = coordinator.enqueue_deferring_wake(&mut tx, params).await?;
                        coordinator.commit_transaction(tx).await?;
                        coordinator.wake(wake).await;
                    }
                }
                done.fetch_add(batch as u64, Ordering::Relaxed);
            }
            Ok::<_, workpump_coordinator::Error>(())
        });
    }
    // A call that hangs must not hang the bench: the producers get the window and a minute.
    let deadline = stop_at + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tasks.join_next()).await {
            Ok(Some(joined)) => joined??,
            Ok(None) => break,
            Err(_) => {
                return Err(
                    "enqueue: a producer did not finish within a minute of its window".into(),
                )
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let items = done.load(Ordering::Relaxed) as f64;
    let cpu = setup::cpu_ticks(std::process::id()).unwrap_or(0) - cpu_before;
    let cpu_us_per_item = cpu as f64 / setup::ticks_per_second() * 1e6 / items.max(1.0);
    Ok((items / elapsed, cpu_us_per_item.round(), items))
}
