//! `cargo xtask demo`: the shortest tour of workpump on a real PostgreSQL — a throwaway
//! database, the migrations, a bulk enqueue, claims under leases, completions, a reclaim of a
//! dead instance's work and a zombie fenced out — printed as it happens.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use workpump_coordinator::*;

use crate::Outcome;

const ITEMS: usize = 2_000;
const QUEUE: &str = "demo";

pub(crate) fn run(_args: &[String]) -> Outcome {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(demo())
}

async fn demo() -> Outcome {
    let server = workpump_testdb::server().await?;
    let db = server.create_database().await?;
    println!("database   {} (dropped at the end)", db.name());
    let pool = db.pool().await?;
    migrate(&pool, DEFAULT_SCHEMA).await?;
    println!("migrated   schema {DEFAULT_SCHEMA:?}");
    let store = PgCoordinator::new(pool.clone());
    store
        .register_queue(RegisterQueueParams::new(QUEUE))
        .await?;

    let started = Instant::now();
    let items = (0..ITEMS)
        .map(|n| NewWork::new(QUEUE, json!({ "n": n })))
        .collect();
    store.enqueue_work(EnqueueWorkParams { items }).await?;
    println!(
        "enqueued   {ITEMS} items in one call ({:?})",
        started.elapsed()
    );

    // Two instances share the work; the first dies half-way through its batch.
    let alive = instance(&store).await?;
    let doomed = instance(&store).await?;
    let lease = Duration::from_secs(60);
    let doomed_batch = store
        .claim_work(ClaimWorkParams {
            instance: doomed,
            queues: vec![QUEUE.into()],
            max_items: 100,
            lease,
        })
        .await?;
    println!(
        "claimed    {} items as instance {doomed} (which now dies without a word)",
        doomed_batch.items.len()
    );

    let mut completed = 0;
    let started = Instant::now();
    loop {
        let batch = store
            .claim_work(ClaimWorkParams {
                instance: alive,
                queues: vec![QUEUE.into()],
                max_items: 500,
                lease,
            })
            .await?;
        if batch.items.is_empty() {
            break;
        }
        let fences = batch.items.iter().map(|c| c.fence).collect();
        let done = store
            .complete_work(CompleteWorkParams {
                instance: alive,
                items: fences,
            })
            .await?;
        done.all_recorded()?;
        completed += done.items.len();
    }
    println!(
        "completed  {completed} items as instance {alive} ({:?})",
        started.elapsed()
    );

    // The dead instance's heartbeat goes stale; a peer's sweep releases its leases.
    sqlx::query(
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 minute'
         WHERE instance_id = $1",
    )
    .bind(doomed.0)
    .execute(&pool)
    .await?;
    let reaped = store
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
        })
        .await?;
    for r in &reaped.reaped {
        println!(
            "reaped     stale instance {} and released its {} leases",
            r.instance, r.released
        );
    }
    let reclaimed = store
        .claim_work(ClaimWorkParams {
            instance: alive,
            queues: vec![QUEUE.into()],
            max_items: 500,
            lease,
        })
        .await?;
    let attempts: Vec<i32> = reclaimed.items.iter().map(|c| c.attempt).collect();
    println!(
        "reclaimed  {} items (attempt {} each, new claim tokens)",
        reclaimed.items.len(),
        attempts.first().copied().unwrap_or_default()
    );
    let done = store
        .complete_work(CompleteWorkParams {
            instance: alive,
            items: reclaimed.items.iter().map(|c| c.fence).collect(),
        })
        .await?;
    done.all_recorded()?;
    completed += done.items.len();

    // The "dead" instance wakes up and reports its old claims: fenced out, nothing changes.
    let late = store
        .complete_work(CompleteWorkParams {
            instance: doomed,
            items: doomed_batch.items.iter().map(|c| c.fence).collect(),
        })
        .await?;
    println!(
        "fenced out {} late completions from the zombie",
        late.fenced_out().count()
    );

    let (finished, lost): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state <> 'completed')
         FROM workpump.work",
    )
    .fetch_one(&pool)
    .await?;
    println!("summary    enqueued {ITEMS}, completed {finished}, not completed {lost}");
    pool.close().await;
    db.drop_database().await?;
    Ok(
        if finished as usize == ITEMS && lost == 0 && completed == ITEMS {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

async fn instance(store: &PgCoordinator) -> Result<InstanceId> {
    let id = InstanceId::new();
    store
        .record_heartbeat(RecordHeartbeatParams {
            instance: id,
            host: "demo".into(),
            metadata: json!({ "pid": std::process::id() }),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
        })
        .await?;
    Ok(id)
}
