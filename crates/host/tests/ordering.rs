//! Ordering keys end to end on PostgreSQL: one host with 8 handler slots, 40 keys of 10 items
//! each enqueued in shuffled batches, some attempts failing once: every key runs its items one
//! at a time in enqueue order, and different keys run side by side.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use workpump_host::{handler_fn, Host, Job, JobArgs, JobError, NewWork, QueueConfig};

use support::{count_state, database, fast_config, wait_until};

const KEYS: usize = 40;
const PER_KEY: u32 = 10;

/// One item of a key: its place in the key's enqueue order, and whether its first attempt
/// fails (and is retried).
#[derive(Serialize, Deserialize)]
struct Step {
    key: String,
    seq: u32,
    fail_first: bool,
}

impl JobArgs for Step {
    const KIND: &'static str = "step";
    const QUEUE: &'static str = "ordered";

    fn ordering_key(&self) -> Option<String> {
        Some(self.key.clone())
    }
}

/// One attempt as its handler saw it.
#[derive(Clone, Debug)]
struct Run {
    seq: u32,
    attempt: i32,
    ok: bool,
    start: Instant,
    end: Instant,
}

#[derive(Default)]
struct Record {
    runs: Mutex<BTreeMap<String, Vec<Run>>>,
    now: AtomicUsize,
    max: AtomicUsize,
}

#[tokio::test]
async fn keyed_items_run_one_at_a_time_in_enqueue_order_and_keys_run_side_by_side() {
    let (db, pool) = database().await;
    let mut config = fast_config();
    config.queues.insert(
        "ordered".into(),
        QueueConfig {
            concurrency: Some(8),
            backoff_base_ms: Some(10),
            backoff_cap_ms: Some(20),
            ..QueueConfig::default()
        },
    );
    let record = Arc::new(Record::default());
    let r = record.clone();
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .job(handler_fn(move |job: Job<Step>| {
            let r = r.clone();
            async move {
                let start = Instant::now();
                let running = r.now.fetch_add(1, Ordering::SeqCst) + 1;
                r.max.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let step = job.payload();
                let ok = !(step.fail_first && job.attempt() == 1);
                r.now.fetch_sub(1, Ordering::SeqCst);
                r.runs
                    .lock()
                    .expect("runs")
                    .entry(step.key.clone())
                    .or_default()
                    .push(Run {
                        seq: step.seq,
                        attempt: job.attempt(),
                        ok,
                        start,
                        end: Instant::now(),
                    });
                if ok {
                    Ok(())
                } else {
                    Err(JobError::retry(format!(
                        "{} #{} fails once",
                        step.key, step.seq
                    )))
                }
            }
        }))
        .start()
        .await
        .expect("the host starts");

    // Every key's items, shuffled across keys; each key's seq follows the order in which
    // its items are enqueued.
    let mut picks: Vec<usize> = (0..KEYS)
        .flat_map(|k| std::iter::repeat_n(k, PER_KEY as usize))
        .collect();
    picks.shuffle(&mut rand::rng());
    let mut next_seq = [0u32; KEYS];
    let items: Vec<NewWork> = picks
        .iter()
        .map(|&k| {
            let seq = next_seq[k];
            next_seq[k] += 1;
            Step {
                key: format!("key-{k}"),
                seq,
                fail_first: (k + seq as usize).is_multiple_of(7),
            }
            .to_work()
            .expect("serialises")
        })
        .collect();
    for batch in items.chunks(37) {
        host.enqueue_many(batch.to_vec()).await.expect("enqueue");
    }

    let total = KEYS as i64 * i64::from(PER_KEY);
    wait_until(
        Duration::from_secs(60),
        "every keyed item completes",
        || async { count_state(&pool, "completed").await == total },
    )
    .await;

    let runs = record.runs.lock().expect("runs").clone();
    assert_eq!(runs.len(), KEYS);
    let mut retried = 0;
    for (key, mut attempts) in runs {
        attempts.sort_by_key(|r| r.start);
        for pair in attempts.windows(2) {
            assert!(
                pair[1].start >= pair[0].end,
                "{key}: #{} attempt {} started before #{} attempt {} ended",
                pair[1].seq,
                pair[1].attempt,
                pair[0].seq,
                pair[0].attempt
            );
        }
        let completed: Vec<u32> = attempts.iter().filter(|r| r.ok).map(|r| r.seq).collect();
        assert_eq!(
            completed,
            (0..PER_KEY).collect::<Vec<_>>(),
            "{key} completes in enqueue order"
        );
        let order: Vec<u32> = attempts.iter().map(|r| r.seq).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "{key}: a retry runs before the next item");
        retried += attempts.iter().filter(|r| !r.ok).count();
    }
    assert!(retried > 0, "some first attempts failed");
    assert!(
        record.max.load(Ordering::SeqCst) > 1,
        "different keys ran side by side"
    );
    assert_eq!(count_state(&pool, "blocked").await, 0);

    host.shutdown();
    host.stopped().await.expect("drained");
    pool.close().await;
    db.drop_database().await.expect("drop");
}
