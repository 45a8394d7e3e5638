//! A long job that checkpoints. Re-indexing 60 000 rows takes a minute, far longer than
//! its lease needs to be, so the handler works in units of 5 000 rows (about 5 s each, well
//! inside the 15 s lease, which is renewed meanwhile) and saves a cursor after each unit.
//! Stop the process part-way — Ctrl-C drains and hands the lease back at once, `kill -9`
//! lets it expire — and start it again: the next attempt starts from the cursor, not from
//! row 0.
//!
//! ```sh
//! cargo xtask pg start    # starts the throwaway PostgreSQL and prints its URL
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin checkpoint -- --enqueue
//! # Ctrl-C after a few units, then run it again (without --enqueue) and watch it resume:
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin checkpoint
//! ```
//!
//! `--enqueue` enqueues the job under a unique key, so running it twice does not start a
//! second re-index while the first is unfinished.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use workpump_host::{handler_fn, Host, HostConfig, Job, JobError, NewWork, QueueConfig};

const QUEUE: &str = "reindex";

/// What to do.
#[derive(Deserialize)]
struct Reindex {
    table: String,
    rows: u64,
    unit: u64,
}

/// How far it got: saved after every unit, handed to the next attempt.
#[derive(Serialize, Deserialize)]
struct Cursor {
    next_row: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let enqueue = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--enqueue") => true,
        Some(other) => return Err(format!("unknown argument {other:?} (try --enqueue)").into()),
    };

    let mut config = HostConfig::load(None)?;
    // A unit (5 s) fits the lease with room to spare; the lease is renewed every 5 s.
    config.queues.entry(QUEUE.into()).or_insert(QueueConfig {
        lease_ms: Some(15_000),
        concurrency: Some(1),
        ..QueueConfig::default()
    });
    // The queue's settings are read when the handler is registered: configure first.
    let host = Host::builder()
        .config(config)
        .database_url(url)
        .handler(QUEUE, handler_fn(reindex))
        .start()
        .await?;
    if enqueue {
        let out = host
            .enqueue_many(vec![NewWork::new(
                QUEUE,
                json!({ "table": "orders", "rows": 60_000, "unit": 5_000 }),
            )
            .unique_key("reindex-orders")])
            .await?;
        match out.items.first() {
            Some(item) if item.inserted => println!("enqueued the re-index as item {}", item.id),
            Some(item) => println!("item {} already re-indexes; not enqueued again", item.id),
            None => {}
        }
    }
    println!("working; Ctrl-C to stop (the progress is kept)");
    host.run_until_signal().await?;
    println!("stopped");
    Ok(())
}

/// Re-indexes `rows` rows of `table`, `unit` at a time, from the saved cursor.
async fn reindex(job: Job<Reindex>) -> workpump_host::JobResult {
    let Reindex { table, rows, unit } = job.payload();
    if *unit == 0 {
        return Err(JobError::dead_letter("unit must be positive"));
    }
    let mut cursor: Cursor = job.checkpoint()?.unwrap_or(Cursor { next_row: 0 });
    if cursor.next_row > 0 {
        println!(
            "attempt {}: resuming {table} at row {} of {rows}",
            job.attempt(),
            cursor.next_row
        );
    } else {
        println!("attempt {}: re-indexing {table} from row 0", job.attempt());
    }
    let stop = job.cancellation_token();
    while cursor.next_row < *rows {
        let end = (cursor.next_row + unit).min(*rows);
        // One unit of work (here: a pause), abandoned when the host asks the handler to stop.
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(*unit)) => {}
            _ = stop.cancelled() => {
                return Err(JobError::cancelled(format!(
                    "stopped at row {}; the checkpoint keeps the progress",
                    cursor.next_row
                )));
            }
        }
        cursor.next_row = end;
        // Fenced: after a lost lease this fails, and the handler stops.
        job.save_checkpoint(&cursor).await?;
        println!("  rows up to {end} done");
    }
    println!("re-indexed {rows} rows of {table}");
    Ok(())
}
