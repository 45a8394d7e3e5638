//! Ordering keys across a fleet, as a seeded property test on PostgreSQL: three hosts in this
//! process share one database; keys are skewed (a few hot keys hold most items, a long tail
//! of keys has one or two); attempts fail, panic, hang until a timeout layer ends them, or
//! wait until an operator cancels them; and one host is killed mid-attempt (its runtime
//! dropped: its connections close, nothing drains), so a peer reclaims that key's head. Every
//! handler run is recorded with one monotonic clock. The properties: per key, no two attempts
//! overlap; attempts run in enqueue order; completions happen in enqueue order (cancelled
//! items skipped), each recorded once with the token of the attempt that succeeded; every key
//! drains. Each fault, the kill and a key handed from one instance to another must really
//! have happened.
//!
//! The seed is printed at the start and in every failure; `ORDERING_FLEET_SEED=<n>` replays
//! one.
//!
//! Nothing dies: faults hit only an item's first two attempts, and the kill at most one more,
//! against the default 10 attempts, so the queue keeps the default dead-head policy (`hold`)
//! and the test asserts that no item became a dead letter (a dead head would stall its key
//! and show as a key that does not drain).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::types::Uuid;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceBuilder;
use workpump_coordinator::{CancelWorkParams, Cancellation, Operations};
use workpump_host::{
    handler_fn, service_handler, CancelReason, Handler, Host, HostConfig, HostHandle, Job, JobArgs,
    JobError, JobResult, NewWork, QueueConfig,
};

use support::{count_state, database, recorded_twice, wait_until};

const QUEUE: &str = "ledger";
/// Hot keys and the items each gets, before the seed varies them by up to a third.
const HOT: [usize; 4] = [45, 25, 15, 10];
/// Tail keys, one or two items each.
const TAIL: usize = 40;
/// What the timeout layer allows a `Slow` attempt.
const TIMEOUT: Duration = Duration::from_millis(300);
/// Attempts started (on any host) before host C, at its next attempt, is killed.
const KILL_AFTER: usize = 40;

/// What an item's early attempts do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Fault {
    /// Runs a few milliseconds and succeeds.
    None,
    /// Attempts 1 and 2 (or only 1) return an error: retried.
    Fail { attempts: i32 },
    /// Attempt 1 panics: retried.
    Panic,
    /// Attempt 1 never ends by itself: the timeout layer of its kind ends it, retried.
    Hang,
    /// Attempt 1 waits until an operator cancels it: the item ends cancelled.
    Cancel,
}

/// One item: its key, its place in the key's enqueue order, and its fault.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Step {
    key: String,
    seq: u32,
    fault: Fault,
}

impl JobArgs for Step {
    const KIND: &'static str = "step";
    const QUEUE: &'static str = QUEUE;

    fn ordering_key(&self) -> Option<String> {
        Some(self.key.clone())
    }
}

/// A step of the kind wrapped in the timeout layer (every `Hang` item is one; so are some
/// others, so that the two kinds interleave within keys).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct Slow(Step);

impl JobArgs for Slow {
    const KIND: &'static str = "slow_step";
    const QUEUE: &'static str = QUEUE;

    fn ordering_key(&self) -> Option<String> {
        self.0.ordering_key()
    }
}

/// One attempt as its handler saw it. `end` is set when the handler's future is gone: it
/// returned, panicked, was dropped by the timeout layer, or by the runtime of a killed host.
#[derive(Clone, Debug)]
struct Run {
    key: String,
    seq: u32,
    item: i64,
    attempt: i32,
    token: i64,
    instance: Uuid,
    start: Instant,
    end: Option<Instant>,
    outcome: &'static str,
}

/// The operator's cancels: the item, and what `cancel_work` answered.
type Answers = Arc<Mutex<Vec<(i64, Result<Cancellation, String>)>>>;

/// What every host's handlers share.
struct Shared {
    runs: Mutex<Vec<Run>>,
    started: AtomicUsize,
    /// Items whose attempt waits for an operator's cancel, to the canceller.
    cancel: mpsc::UnboundedSender<i64>,
    /// Fired by host C's first attempt after `KILL_AFTER`, which then waits to be killed.
    kill: Mutex<Option<oneshot::Sender<()>>>,
    /// Host C's instance, once known.
    victim: Mutex<Option<Uuid>>,
}

/// Sets its run's end (and outcome, unless the handler set one) when dropped.
struct EndOnDrop<'a> {
    shared: &'a Shared,
    index: usize,
    outcome: &'static str,
}

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        let mut runs = self.shared.runs.lock().unwrap_or_else(|e| e.into_inner());
        let run = &mut runs[self.index];
        run.end = Some(Instant::now());
        run.outcome = self.outcome;
    }
}

async fn attempt<T>(shared: Arc<Shared>, job: Job<T>, step: &Step) -> JobResult {
    let index = {
        let mut runs = shared.runs.lock().expect("runs");
        runs.push(Run {
            key: step.key.clone(),
            seq: step.seq,
            item: job.id(),
            attempt: job.attempt(),
            token: job.fence().token,
            instance: job.instance().0,
            start: Instant::now(),
            end: None,
            outcome: "dropped",
        });
        runs.len() - 1
    };
    let mut guard = EndOnDrop {
        shared: &shared,
        index,
        outcome: "dropped",
    };
    let started = shared.started.fetch_add(1, Ordering::SeqCst) + 1;
    let on_victim = *shared.victim.lock().expect("victim") == Some(job.instance().0);
    if on_victim && started > KILL_AFTER {
        let kill = shared.kill.lock().expect("kill").take();
        if let Some(kill) = kill {
            guard.outcome = "killed";
            let _ = kill.send(());
            // The host's runtime is dropped under this attempt.
            std::future::pending::<()>().await;
        }
    }
    let first = job.attempt() == 1;
    match step.fault {
        Fault::Fail { attempts } if job.attempt() <= attempts => {
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.outcome = "failed";
            Err(JobError::retry(format!(
                "{} #{} fails attempt {}",
                step.key,
                step.seq,
                job.attempt()
            )))
        }
        Fault::Panic if first => {
            guard.outcome = "panicked";
            panic!("{} #{} panics on purpose", step.key, step.seq);
        }
        Fault::Hang if first => {
            guard.outcome = "timed out";
            std::future::pending::<()>().await;
            unreachable!("only the timeout layer ends this attempt");
        }
        Fault::Cancel if first => {
            let token = job.cancellation_token();
            shared.cancel.send(job.id()).expect("the canceller listens");
            // The cancel arrives in the next renewal reply (within a renewal interval).
            let _ = tokio::time::timeout(Duration::from_secs(20), token.cancelled()).await;
            match job.cancel_reason() {
                Some(CancelReason::CancelRequested) => {
                    guard.outcome = "cancelled";
                    Err(JobError::cancelled("the operator cancelled it"))
                }
                other => {
                    guard.outcome = "not cancelled";
                    Err(JobError::retry(format!(
                        "stopped without a cancel: {other:?}"
                    )))
                }
            }
        }
        _ => {
            let ms = 1 + job.id().rem_euclid(8) as u64;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.outcome = "ok";
            Ok(())
        }
    }
}

fn step_handler(shared: &Arc<Shared>) -> impl Handler<Payload = Step> {
    let shared = shared.clone();
    handler_fn(move |job: Job<Step>| {
        let shared = shared.clone();
        async move {
            let step = job.payload().clone();
            attempt(shared, job, &step).await
        }
    })
}

fn slow_handler(shared: &Arc<Shared>) -> impl Handler<Payload = Slow> {
    let shared = shared.clone();
    service_handler(
        ServiceBuilder::new().timeout(TIMEOUT).service(
            handler_fn(move |job: Job<Slow>| {
                let shared = shared.clone();
                async move {
                    let step = job.payload().0.clone();
                    attempt(shared, job, &step).await
                }
            })
            .into_service(),
        ),
    )
}

/// The shipped defaults, but for the queue's retry backoff (10 ms base, 50 ms cap instead of
/// 1 s and 5 min: a hot key retries a dozen times in a row, and backoffs of 2, 4, 8 s would
/// take minutes) and its lease (6 s instead of 60 s: an operator's cancel reaches a running
/// handler in the next renewal reply, within a third of the lease, 20 s at the default).
/// Liveness, polling, heartbeat and maintenance are the defaults: the killed host is found
/// dead by its lost alive-lock after the 3 s lock grace, at a 5 s sweep.
fn config() -> HostConfig {
    let mut config = HostConfig::default();
    config.queues.insert(
        QUEUE.into(),
        QueueConfig {
            backoff_base_ms: Some(10),
            backoff_cap_ms: Some(50),
            lease_ms: Some(6_000),
            ..QueueConfig::default()
        },
    );
    config
}

async fn start(shared: &Arc<Shared>, url: &str) -> HostHandle {
    let host = Host::builder()
        .config(config())
        .database_url(url)
        .job(step_handler(shared))
        .job(slow_handler(shared))
        .start()
        .await
        .expect("a host starts");
    host.ready().await.expect("the host is ready");
    host
}

/// The items to enqueue, in enqueue order: keys skewed (hot keys with tens of items, tail
/// keys with one or two), items of all keys shuffled, faults drawn by the seed, and each
/// fault present at least once.
fn plan(rng: &mut StdRng) -> Vec<Step> {
    let mut picks: Vec<String> = Vec::new();
    for (k, n) in HOT.iter().enumerate() {
        let n = rng.random_range(n * 2 / 3..=n * 4 / 3);
        picks.extend(std::iter::repeat_n(format!("hot-{k}"), n));
    }
    for k in 0..TAIL {
        picks.extend(std::iter::repeat_n(
            format!("tail-{k}"),
            rng.random_range(1..=2),
        ));
    }
    picks.shuffle(rng);
    let mut next: HashMap<String, u32> = HashMap::new();
    let mut steps: Vec<Step> = picks
        .into_iter()
        .map(|key| {
            let seq = next.entry(key.clone()).or_default();
            let step = Step {
                seq: *seq,
                fault: match rng.random_range(0..100) {
                    0..10 => Fault::Fail {
                        attempts: rng.random_range(1..=2),
                    },
                    10..15 => Fault::Panic,
                    15..20 => Fault::Hang,
                    20..24 => Fault::Cancel,
                    _ => Fault::None,
                },
                key,
            };
            *seq += 1;
            step
        })
        .collect();
    for fault in [
        Fault::Fail { attempts: 1 },
        Fault::Panic,
        Fault::Hang,
        Fault::Cancel,
    ] {
        let present = steps
            .iter()
            .any(|s| std::mem::discriminant(&s.fault) == std::mem::discriminant(&fault));
        if !present {
            let i = rng.random_range(0..steps.len());
            steps[i].fault = fault;
        }
    }
    steps
}

fn to_work(step: &Step, rng: &mut StdRng) -> NewWork {
    // Every hang is of the slow kind; a fifth of the others too, but no cancel (the timeout
    // would end its wait before the cancel arrives).
    let slow = match step.fault {
        Fault::Hang => true,
        Fault::Cancel => false,
        _ => rng.random_range(0..5) == 0,
    };
    if slow {
        Slow(step.clone()).to_work()
    } else {
        step.to_work()
    }
    .expect("serialises")
}

/// Host C, on a runtime of its own in its own thread, so that it can die the way a process
/// does: when `kill` fires, its runtime is shut down without a drain (every task dropped,
/// its connections closed, its alive-lock gone with them). Returns C's instance and the
/// thread, which ends once the runtime is gone.
fn start_victim(
    shared: &Arc<Shared>,
    url: &str,
    kill: oneshot::Receiver<()>,
) -> (Uuid, std::thread::JoinHandle<()>) {
    let (instance_tx, instance_rx) = std::sync::mpsc::channel();
    let shared = shared.clone();
    let url = url.to_owned();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("host C's runtime");
        let host = runtime.block_on(start(&shared, &url));
        instance_tx
            .send(host.instance().0)
            .expect("the test waits for C");
        // Killed, or the test ended (the sender dropped) without killing it.
        let _ = runtime.block_on(kill);
        drop(host);
        runtime.shutdown_background();
    });
    let instance = instance_rx.recv().expect("host C started");
    (instance, thread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hosts_run_skewed_keys_in_enqueue_order_through_faults_cancels_and_a_killed_host() {
    let seed: u64 = std::env::var("ORDERING_FLEET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("ordering_fleet seed {seed} (replay with ORDERING_FLEET_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    // The injected panics are expected: keep their messages (and backtraces) out of the log.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload().downcast_ref::<String>();
        if !message.is_some_and(|m| m.contains("panics on purpose")) {
            report(info);
        }
    }));
    let began = Instant::now();

    let (db, pool) = database().await;
    let (cancel_tx, mut cancel_rx) = mpsc::unbounded_channel();
    let (kill_tx, kill_rx) = oneshot::channel();
    let shared = Arc::new(Shared {
        runs: Mutex::new(Vec::new()),
        started: AtomicUsize::new(0),
        cancel: cancel_tx,
        kill: Mutex::new(Some(kill_tx)),
        victim: Mutex::new(None),
    });
    let a = start(&shared, db.url()).await;
    let b = start(&shared, db.url()).await;
    let (victim, thread) = start_victim(&shared, db.url(), kill_rx);
    *shared.victim.lock().expect("victim") = Some(victim);

    // The operator: cancels each item whose attempt waits for it, through A's store.
    let ops = a.pg().expect("a PostgreSQL host").clone();
    let answers: Answers = Arc::default();
    let canceller = tokio::spawn({
        let answers = answers.clone();
        async move {
            while let Some(id) = cancel_rx.recv().await {
                let answer = ops.cancel_work(CancelWorkParams { id }).await;
                let answer = answer.map(|o| o.cancellation).map_err(|e| e.to_string());
                answers.lock().expect("answers").push((id, answer));
            }
        }
    });

    let steps = plan(&mut rng);
    let total = steps.len() as i64;
    let plan_keys: BTreeMap<String, Vec<u32>> =
        steps.iter().fold(BTreeMap::new(), |mut keys, s| {
            keys.entry(s.key.clone()).or_default().push(s.seq);
            keys
        });
    // Enqueued in batches of 1 to 24, alternately by A and B; each batch commits before the
    // next is sent, so a key's enqueue order is the plan's order.
    let mut ids: HashMap<i64, (String, u32)> = HashMap::new();
    let mut rest = &steps[..];
    let mut turn = 0;
    while !rest.is_empty() {
        let n = rng.random_range(1..=24).min(rest.len());
        let (batch, tail) = rest.split_at(n);
        rest = tail;
        let work: Vec<NewWork> = batch.iter().map(|s| to_work(s, &mut rng)).collect();
        let producer = if turn % 2 == 0 { &a } else { &b };
        turn += 1;
        let out = producer.enqueue_many(work).await.expect("enqueue");
        for (step, item) in batch.iter().zip(&out.items) {
            ids.insert(item.id, (step.key.clone(), step.seq));
        }
    }
    assert_eq!(ids.len(), steps.len(), "seed {seed}: every item enqueued");

    // Every key drains: every item ends completed or cancelled.
    wait_until(
        Duration::from_secs(90),
        &format!("every item ends (seed {seed})"),
        || async {
            count_state(&pool, "completed").await + count_state(&pool, "cancelled").await == total
        },
    )
    .await;
    let drained = began.elapsed();
    for host in [&a, &b] {
        host.shutdown();
    }
    for host in [&a, &b] {
        host.stopped().await.expect("a clean drain");
    }
    canceller.abort();
    // Taking the sender ends C's thread if C was never killed (the test then fails below).
    let killed = shared.kill.lock().expect("kill").take().is_none();
    thread.join().expect("host C's thread");

    for state in ["dead", "blocked", "available", "scheduled", "running"] {
        assert_eq!(
            count_state(&pool, state).await,
            0,
            "seed {seed}: no item left {state}"
        );
    }
    assert_eq!(
        recorded_twice(&pool).await,
        0,
        "seed {seed}: each outcome recorded once"
    );

    let runs = shared.runs.lock().expect("runs").clone();
    assert!(
        runs.iter().all(|r| r.end.is_some()),
        "seed {seed}: every attempt's handler ended"
    );
    let mut per_key: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        per_key.entry(&run.key).or_default().push(run);
    }
    assert_eq!(per_key.len(), plan_keys.len(), "seed {seed}: every key ran");
    let mut handed_over = 0;
    for (key, attempts) in &mut per_key {
        attempts.sort_by_key(|r| r.start);
        for pair in attempts.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(
                after.start >= before.end.expect("ended"),
                "seed {seed}: {key}: #{} attempt {} on {} started before #{} attempt {} on {} \
                 ended ({})",
                after.seq,
                after.attempt,
                after.instance,
                before.seq,
                before.attempt,
                before.instance,
                before.outcome
            );
            assert!(
                after.seq >= before.seq,
                "seed {seed}: {key}: #{} ran after #{}, out of enqueue order",
                after.seq,
                before.seq
            );
            if after.instance != before.instance {
                handed_over += 1;
            }
        }
    }

    // Completions, in the order the store recorded them, with the token that recorded each.
    let completions: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT item, from_token FROM workpump_audit WHERE to_state = 'completed' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .expect("the completions");
    let cancelled: BTreeSet<i64> =
        sqlx::query_scalar::<_, i64>("SELECT id FROM workpump.work_all WHERE state = 'cancelled'")
            .fetch_all(&pool)
            .await
            .expect("the cancelled items")
            .into_iter()
            .collect();
    let ok_tokens: BTreeSet<(i64, i64)> = runs
        .iter()
        .filter(|r| r.outcome == "ok")
        .map(|r| (r.item, r.token))
        .collect();
    let mut completed_per_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (item, token) in &completions {
        let (key, seq) = &ids[item];
        completed_per_key.entry(key).or_default().push(*seq);
        let token = token.expect("a completion has its claim's token");
        assert!(
            ok_tokens.contains(&(*item, token)),
            "seed {seed}: item {item} was completed by token {token}, not by an attempt that \
             succeeded"
        );
    }
    for (key, seqs) in &plan_keys {
        let expected: Vec<u32> = seqs
            .iter()
            .copied()
            .filter(|seq| {
                !ids.iter()
                    .any(|(id, (k, s))| k == key && s == seq && cancelled.contains(id))
            })
            .collect();
        assert_eq!(
            completed_per_key
                .get(key.as_str())
                .cloned()
                .unwrap_or_default(),
            expected,
            "seed {seed}: {key} completes in enqueue order, its cancelled items skipped"
        );
    }

    // Non-vacuity: each fault, the cancels, the kill and the handover happened.
    let count = |outcome: &str| runs.iter().filter(|r| r.outcome == outcome).count();
    let answers = answers.lock().expect("answers").clone();
    let requested = answers
        .iter()
        .filter(|(_, a)| matches!(a, Ok(Cancellation::Requested)))
        .count();
    eprintln!(
        "ordering_fleet seed {seed}: {total} items over {} keys, {} attempts, {} failed, {} \
         panicked, {} timed out, {} cancelled ({requested} requests), {} killed, {handed_over} \
         handovers between instances; drained in {drained:?}",
        plan_keys.len(),
        runs.len(),
        count("failed"),
        count("panicked"),
        count("timed out"),
        cancelled.len(),
        count("killed"),
    );
    assert!(count("failed") > 0, "seed {seed}: some attempts failed");
    assert!(count("panicked") > 0, "seed {seed}: some attempts panicked");
    assert!(
        count("timed out") > 0,
        "seed {seed}: some attempts timed out"
    );
    assert!(
        requested > 0 && !cancelled.is_empty(),
        "seed {seed}: an operator cancelled running items: {answers:?}"
    );
    assert!(
        cancelled
            .iter()
            .all(|id| answers.iter().any(|(asked, _)| asked == id)),
        "seed {seed}: only items the operator cancelled ended cancelled"
    );
    assert!(killed, "seed {seed}: host C was killed mid-attempt");
    let victims: Vec<&Run> = runs.iter().filter(|r| r.outcome == "killed").collect();
    assert_eq!(victims.len(), 1, "seed {seed}: one attempt was killed");
    let victim_run = victims[0];
    assert_eq!(victim_run.instance, victim);
    assert!(
        runs.iter().any(|r| r.item == victim_run.item
            && r.attempt > victim_run.attempt
            && r.instance != victim),
        "seed {seed}: a peer reclaimed the killed host's head (item {})",
        victim_run.item
    );
    assert!(
        handed_over > 0,
        "seed {seed}: some key ran on two instances"
    );

    pool.close().await;
    db.drop_database().await.expect("drop");
}
