//! The claim worker end to end against PostgreSQL, with the real lease-renewal worker:
//! completion, retries into the dead letters, panics, checkpoints across a reclaim,
//! transactional completion on a lost lease, operator cancel, NOTIFY wake-ups and a killed
//! listener; the lifecycle hooks' sequence for each ending, and tower layers around handlers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::*;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::*;
use workpump_lease_renewal::{LeaseConfig, LeaseRenewalWorker};
use workpump_testdb::TestDatabase;

struct Env {
    _db: TestDatabase,
    pool: PgPool,
    pg: PgCoordinator,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), WorkerError>>>,
    status: tokio::sync::watch::Receiver<ClaimStatus>,
    identity: Identity,
}

/// Fast polling for tests: the safety net every 50..200 ms unless told otherwise.
fn fast() -> ClaimConfig {
    ClaimConfig {
        poll_base_ms: 50,
        poll_max_ms: 200,
        notify_healthy_base_ms: None,
        ..ClaimConfig::default()
    }
}

fn short_lease() -> LeaseSettings {
    LeaseSettings {
        lease: Duration::from_millis(1500),
        renewal_interval: Duration::from_millis(300),
        grace: Duration::from_millis(250),
        max_renewals: None,
        max_duration: None,
    }
}

async fn setup<H: Handler>(handler: H, settings: QueueSettings, config: ClaimConfig) -> Env {
    setup_with(
        move |handlers| {
            handlers.add("q", handler, settings).expect("handler");
        },
        config,
    )
    .await
}

/// A claim worker on queue `q` with the handlers (and layers, hooks) `register` adds.
async fn setup_with(register: impl FnOnce(&mut Handlers), config: ClaimConfig) -> Env {
    let FreshStore {
        coordinator: pg,
        pool,
        db,
    } = fresh_store().await;
    pg.register_queue(RegisterQueueParams {
        ordering_dead_head: Default::default(),
        max_running: None,
        rate_limit: None,
        name: "q".into(),
        max_attempts: 5,
        owner: None,
    })
    .await
    .expect("queue");
    let coordinator: Arc<dyn WorkCoordinator> = Arc::new(pg.clone());
    let renewal = Arc::new(LeaseRenewalWorker::new(
        coordinator.clone(),
        LeaseConfig {
            window_ms: 20,
            ..LeaseConfig::default()
        },
    ));
    // The claim worker never beats: register the instance as its heartbeat worker would.
    let identity = Identity::new();
    let registered = pg
        .record_heartbeat(RecordHeartbeatParams {
            instance: identity.current(),
            host: "pg-test".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: None,
            alive_lock: AliveLockReport::NotHeld,
            registering: true,
        })
        .await
        .expect("register");
    assert!(!registered.evicted);
    identity.mark_registered(identity.current());
    let mut handlers = Handlers::new();
    register(&mut handlers);
    let worker = Arc::new(ClaimWorker::new(
        coordinator,
        Some(pg.clone()),
        Arc::new(renewal.leases()),
        identity.clone(),
        handlers,
        config,
    ));
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for w in [renewal as Arc<dyn Worker>, worker as Arc<dyn Worker>] {
        let token = shutdown.clone();
        tasks.push(tokio::spawn(async move { w.run(token).await }));
    }
    Env {
        _db: db,
        pool,
        pg,
        shutdown,
        tasks,
        status,
        identity,
    }
}

impl Env {
    /// Expires item `id`'s lease and runs the sweep's release of lapsed leases (a
    /// maintenance sweep; this rig runs none), so that the next claim reclaims it.
    async fn expire_and_sweep(&self, id: WorkId) {
        sqlx::query("UPDATE workpump.work SET lease_expiry = now() - interval '1 s' WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("expire");
        sqlx::query("SELECT * FROM workpump.dead_letter_expired(1000)")
            .execute(&self.pool)
            .await
            .expect("sweep");
    }

    /// A peer takes item `id` over: its lease is expired, a sweep releases it and another
    /// registered instance claims it (the item must be the queue's only claimable one).
    async fn peer_takes(&self, id: WorkId) {
        self.expire_and_sweep(id).await;
        let peer = InstanceId::new();
        self.pg
            .record_heartbeat(RecordHeartbeatParams {
                instance: peer,
                host: "peer".into(),
                metadata: json!({}),
                stale_after: Duration::from_secs(30),
                dead_after: None,
                lock_grace: None,
                alive_lock: AliveLockReport::NotHeld,
                registering: true,
            })
            .await
            .expect("peer");
        let taken = self
            .pg
            .claim_work(ClaimWorkParams {
                instance: peer,
                queues: vec!["q".into()],
                max_items: 1,
                lease: Duration::from_secs(60),
                async_commit: false,
            })
            .await
            .expect("peer claims");
        assert_eq!(taken.items.len(), 1, "the peer took the item");
        assert_eq!(taken.items[0].fence.id, id);
    }

    async fn enqueue(&self, items: Vec<NewWork>) -> Vec<WorkId> {
        self.pg
            .enqueue_work(EnqueueWorkParams { items })
            .await
            .expect("enqueue")
            .items
            .into_iter()
            .map(|e| e.id)
            .collect()
    }

    async fn state(&self, id: WorkId) -> String {
        sqlx::query_scalar("SELECT state::text FROM workpump.work_all WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("state")
    }

    async fn wait_for_state(&self, id: WorkId, state: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.state(id).await;
            if now == state {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "item {id} stayed {now}, never {state}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn errors(&self, id: WorkId) -> Vec<Value> {
        let v: Value = sqlx::query_scalar("SELECT errors FROM workpump.work_all WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("errors");
        v.as_array().cloned().unwrap_or_default()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("workers stop")
                .expect("join")
                .expect("clean stop");
        }
    }
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_enqueued_item_runs_and_is_completed() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let env = setup(
        handler_fn(move |job: Job<Value>| {
            let s = s.clone();
            async move {
                s.lock()
                    .unwrap()
                    .push((job.id(), job.attempt(), job.payload().clone()));
                Ok(())
            }
        }),
        QueueSettings::default(),
        fast(),
    )
    .await;
    let ids = env
        .enqueue(vec![NewWork::new("q", json!({"hello": "world"})); 3])
        .await;
    for id in &ids {
        env.wait_for_state(*id, "completed").await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|(_, attempt, p)| *attempt == 1 && p["hello"] == "world"));
    env.stop().await;
}

#[tokio::test]
async fn a_failing_handler_is_retried_with_growing_delays_then_dead_lettered_with_its_history() {
    let env = setup(
        handler_fn(|job: Job<Value>| async move {
            Err(JobError::retry(format!("failure {}", job.attempt())))
        }),
        QueueSettings {
            backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(10),
            },
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "dead").await;
    let errors = env.errors(id).await;
    let messages: Vec<&str> = errors
        .iter()
        .map(|e| e["error"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        vec![
            "failure 1",
            "failure 2",
            "failure 3",
            "failure 4",
            "failure 5"
        ]
    );
    // Attempt n failed at `at`; attempt n+1 started about 100 ms × 2^n later.
    let at: Vec<chrono::DateTime<chrono::Utc>> = errors
        .iter()
        .map(|e| e["at"].as_str().unwrap().parse().unwrap())
        .collect();
    let gaps: Vec<i64> = at
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds())
        .collect();
    for (n, gap) in gaps.iter().enumerate() {
        let nominal = 100 * (1 << (n + 1));
        assert!(
            *gap as f64 >= nominal as f64 * 0.9,
            "retry {n} came after {gap} ms, before its {nominal} ms backoff: {gaps:?}"
        );
    }
    // The lower bounds double, so the waits grow; the gaps themselves also hold the time to
    // pick each retry up, which a loaded machine stretches unevenly, so they are not compared
    // with each other.
    env.stop().await;
}

#[tokio::test]
async fn a_panicking_handler_is_recorded_as_a_failure_with_the_panic_message() {
    let env = setup(
        handler_fn(|job: Job<Value>| async move {
            if job.attempt() == 1 {
                panic!("the handler fell over");
            }
            Ok(())
        }),
        QueueSettings {
            backoff: Backoff {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(50),
            },
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    let errors = env.errors(id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0]["error"],
        "the handler panicked: the handler fell over"
    );
    assert_eq!(errors[0]["kind"], "failed");
    env.stop().await;
}

#[tokio::test]
async fn a_payload_that_does_not_match_the_type_is_dead_lettered_with_the_serde_error() {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[allow(dead_code)]
        count: u32,
    }
    let env = setup(
        handler_fn(|_job: Job<Typed>| async move { Ok(()) }),
        QueueSettings::default(),
        fast(),
    )
    .await;
    let id = env
        .enqueue(vec![NewWork::new("q", json!({"count": "ten"}))])
        .await[0];
    env.wait_for_state(id, "dead").await;
    let errors = env.errors(id).await;
    let message = errors[0]["error"].as_str().unwrap();
    assert!(
        message.contains("does not match") && message.contains("Typed"),
        "{message}"
    );
    assert_eq!(errors[0]["kind"], "rejected");
    env.stop().await;
}

#[tokio::test]
async fn a_reclaimed_item_resumes_from_its_checkpoint() {
    let saved = Arc::new(Notify::new());
    let resumed = Arc::new(Mutex::new(None));
    let (s, r) = (saved.clone(), resumed.clone());
    let env = setup(
        handler_fn(move |job: Job<Value>| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                if job.attempt() == 1 {
                    job.save_checkpoint(&json!({"done_units": 3})).await?;
                    s.notify_one();
                    job.cancellation_token().cancelled().await;
                    return Err(JobError::cancelled("lost the lease"));
                }
                *r.lock().unwrap() = Some((job.attempt(), job.checkpoint::<Value>()?));
                Ok(())
            }
        }),
        QueueSettings {
            lease: short_lease(),
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    saved.notified().await;
    // The lease expires under the handler (as if renewals had stopped) and the sweep releases
    // it: the next renewal reports it lost, and the next claim reclaims it.
    env.expire_and_sweep(id).await;
    env.wait_for_state(id, "completed").await;
    assert_eq!(
        resumed.lock().unwrap().clone(),
        Some((2, Some(json!({"done_units": 3}))))
    );
    env.stop().await;
}

#[tokio::test]
async fn a_handler_whose_lease_was_lost_cannot_commit_its_transactional_completion() {
    let go = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let outcome = Arc::new(Mutex::new(None));
    let (g, st, o) = (go.clone(), started.clone(), outcome.clone());
    let env = setup(
        handler_fn(move |job: Job<Value>| {
            let (g, st, o) = (g.clone(), st.clone(), o.clone());
            async move {
                st.notify_one();
                g.notified().await;
                let result = async {
                    let mut tx = job.begin_transaction().await?;
                    sqlx::query("INSERT INTO effects (item) VALUES ($1)")
                        .bind(job.id())
                        .execute(tx.connection())
                        .await?;
                    tx.complete().await
                }
                .await;
                *o.lock().unwrap() = Some(result.as_ref().map_err(|e| e.to_string()).err());
                result
            }
        }),
        QueueSettings {
            // One slot, held by the running handler: this instance cannot claim the item back
            // itself (a late wake-up from the enqueue's notification would) once its lease is
            // expired below.
            concurrency: 1,
            lease: LeaseSettings {
                // Long renewal interval: the lease is taken away before any renewal notices.
                renewal_interval: Duration::from_secs(20),
                grace: Duration::from_secs(5),
                ..LeaseSettings::from_lease(Duration::from_secs(60))
            },
            ..QueueSettings::default()
        },
        // No timer polls: once the item is running, nothing but the peer claims it.
        ClaimConfig {
            safety_net_poll: false,
            ..ClaimConfig::default()
        },
    )
    .await;
    let mut status = env.status.clone();
    status
        .wait_for(|s| s.gate == Gate::Healthy && s.registered.is_some())
        .await
        .expect("healthy");
    sqlx::query("CREATE TABLE effects (item bigint PRIMARY KEY)")
        .execute(&env.pool)
        .await
        .expect("table");
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    started.notified().await;
    // A peer takes the item over: expire the lease and claim it as another instance.
    env.peer_takes(id).await;
    go.notify_one();
    wait_until("the handler tried to commit", || {
        outcome.lock().unwrap().is_some()
    })
    .await;
    let error = outcome.lock().unwrap().clone().flatten();
    assert!(
        error.as_deref().is_some_and(|e| e.contains("fenced out")),
        "{error:?}"
    );
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&env.pool)
        .await
        .expect("count");
    assert_eq!(effects, 0, "the business write was rolled back");
    assert_eq!(env.state(id).await, "running", "still the peer's");
    env.stop().await;
}

#[tokio::test]
async fn an_operator_cancel_stops_a_running_handler_and_the_item_ends_cancelled() {
    let started = Arc::new(Notify::new());
    let reason = Arc::new(Mutex::new(None));
    let (st, r) = (started.clone(), reason.clone());
    let env = setup(
        handler_fn(move |job: Job<Value>| {
            let (st, r) = (st.clone(), r.clone());
            async move {
                st.notify_one();
                job.cancellation_token().cancelled().await;
                *r.lock().unwrap() = job.cancel_reason();
                Err(JobError::cancelled("stopped on request"))
            }
        }),
        QueueSettings {
            lease: short_lease(),
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    started.notified().await;
    sqlx::query("UPDATE workpump.work SET cancel_requested = true WHERE id = $1")
        .bind(id)
        .execute(&env.pool)
        .await
        .expect("request cancel");
    env.wait_for_state(id, "cancelled").await;
    assert_eq!(*reason.lock().unwrap(), Some(CancelReason::CancelRequested));
    env.stop().await;
}

#[tokio::test]
async fn a_notify_from_another_connection_wakes_an_idle_worker() {
    let ran = Arc::new(Notify::new());
    let r = ran.clone();
    // No safety-net poll: with LISTEN healthy the worker sleeps until a signal, so only the
    // NOTIFY can wake it.
    let env = setup(
        handler_fn(move |_job: Job<Value>| {
            let r = r.clone();
            async move {
                r.notify_one();
                Ok(())
            }
        }),
        QueueSettings::default(),
        ClaimConfig {
            safety_net_poll: false,
            ..ClaimConfig::default()
        },
    )
    .await;
    let mut status = env.status.clone();
    status
        .wait_for(|s| s.gate == Gate::Healthy && s.registered.is_some())
        .await
        .expect("healthy");
    // Another process's connection enqueues.
    let server = workpump_testdb::server().await.expect("server");
    let _ = server;
    let other = PgCoordinator::new(
        PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*env.pool.connect_options()).clone())
            .await
            .expect("other pool"),
    );
    let enqueued = tokio::time::Instant::now();
    other
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!({}))],
        })
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(10), ran.notified())
        .await
        .expect("the NOTIFY woke the worker");
    tracing::info!("picked up after {:?}", enqueued.elapsed());
    env.stop().await;
}

#[tokio::test]
async fn with_its_listener_killed_the_worker_falls_back_to_polling_and_processes_everything() {
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    let env = setup(
        handler_fn(move |_job: Job<Value>| {
            let c = c.clone();
            async move {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        }),
        QueueSettings::default(),
        ClaimConfig {
            poll_base_ms: 50,
            ..ClaimConfig::default()
        },
    )
    .await;
    let mut status = env.status.clone();
    status
        .wait_for(|s| s.gate == Gate::Healthy)
        .await
        .expect("healthy");
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&env.pool)
    .await
    .expect("terminate");
    assert_eq!(killed, vec![true]);
    let ids = env.enqueue(vec![NewWork::new("q", json!({})); 50]).await;
    for id in &ids {
        env.wait_for_state(*id, "completed").await;
    }
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 50);
    // And the listener comes back.
    status
        .wait_for(|s| s.gate == Gate::Healthy)
        .await
        .expect("healthy again");
    env.stop().await;
}

// ---- Lifecycle hooks and handler middleware ----

/// Hooks that write every call into one list: "claimed 1", "started 1", "ended 1: <ending>".
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl JobHooks for Journal {
    async fn claimed(&self, attempt: &Attempt) -> JobResult {
        self.push(format!("claimed {}", attempt.attempt()));
        Ok(())
    }
    fn started(&self, attempt: &Attempt) {
        self.push(format!("started {}", attempt.attempt()));
    }
    async fn ended(&self, attempt: &Attempt, ending: &Ending) {
        self.push(format!("ended {}: {ending}", attempt.attempt()));
    }
}

impl Journal {
    fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `n` endings were recorded, then checks each attempt has exactly one
    /// claimed and one ended, the ended last, and returns the journal.
    async fn after_endings(&self, n: usize) -> Vec<String> {
        let endings = || {
            self.lines()
                .iter()
                .filter(|l| l.starts_with("ended"))
                .count()
        };
        wait_until(&format!("{n} endings"), || endings() >= n).await;
        let lines = self.lines();
        let mut attempt = 0;
        for line in &lines {
            let n: i32 = line
                .split([' ', ':'])
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap();
            if line.starts_with("claimed") {
                assert_eq!(n, attempt + 1, "a claimed hook out of order: {lines:?}");
                attempt = n;
            } else {
                assert_eq!(n, attempt, "a hook for another attempt: {lines:?}");
            }
        }
        for a in 1..=attempt {
            let of = |what: &str| {
                lines
                    .iter()
                    .filter(|l| l.starts_with(&format!("{what} {a}")))
                    .count()
            };
            assert_eq!(of("claimed"), 1, "attempt {a}: {lines:?}");
            assert_eq!(of("ended"), 1, "attempt {a}: one ending: {lines:?}");
        }
        lines
    }
}

fn quick_backoff() -> Backoff {
    Backoff {
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
    }
}

/// A worker on queue `q` running `handler`, with `journal` as its hooks.
async fn journaled<H: Handler>(
    handler: H,
    journal: &Journal,
    settings: QueueSettings,
    config: ClaimConfig,
) -> Env {
    let journal = journal.clone();
    setup_with(
        move |handlers| {
            handlers
                .add("q", handler, settings)
                .expect("handler")
                .hooks(journal);
        },
        config,
    )
    .await
}

#[tokio::test]
async fn hooks_see_claimed_started_and_completed_for_a_completed_item() {
    let journal = Journal::default();
    let env = journaled(
        handler_fn(|_job: Job<Value>| async move { Ok(()) }),
        &journal,
        QueueSettings::default(),
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    assert_eq!(
        journal.after_endings(1).await,
        vec!["claimed 1", "started 1", "ended 1: completed"]
    );
    env.stop().await;
}

#[tokio::test]
async fn hooks_see_a_failed_attempt_that_will_be_retried_then_the_completed_retry() {
    let journal = Journal::default();
    let env = journaled(
        handler_fn(|job: Job<Value>| async move {
            if job.attempt() == 1 {
                return Err(JobError::retry("boom"));
            }
            Ok(())
        }),
        &journal,
        QueueSettings {
            backoff: quick_backoff(),
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    assert_eq!(
        journal.after_endings(2).await,
        vec![
            "claimed 1",
            "started 1",
            "ended 1: failed (will be retried): boom",
            "claimed 2",
            "started 2",
            "ended 2: completed",
        ]
    );
    env.stop().await;
}

#[tokio::test]
async fn hooks_see_a_dead_letter() {
    let journal = Journal::default();
    let env = journaled(
        handler_fn(|_job: Job<Value>| async move { Err(JobError::dead_letter("no such user")) }),
        &journal,
        QueueSettings::default(),
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "dead").await;
    assert_eq!(
        journal.after_endings(1).await,
        vec![
            "claimed 1",
            "started 1",
            "ended 1: dead-lettered: no such user"
        ]
    );
    env.stop().await;
}

#[tokio::test]
async fn hooks_see_an_operator_cancel_of_a_running_handler() {
    let journal = Journal::default();
    let env = journaled(
        handler_fn(|job: Job<Value>| async move {
            job.cancellation_token().cancelled().await;
            Err(JobError::cancelled("stopped on request"))
        }),
        &journal,
        QueueSettings {
            lease: short_lease(),
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    wait_until("the handler started", || journal.lines().len() == 2).await;
    sqlx::query("UPDATE workpump.work SET cancel_requested = true WHERE id = $1")
        .bind(id)
        .execute(&env.pool)
        .await
        .expect("request cancel");
    env.wait_for_state(id, "cancelled").await;
    assert_eq!(
        journal.after_endings(1).await,
        vec![
            "claimed 1",
            "started 1",
            "ended 1: cancelled: stopped on request"
        ]
    );
    env.stop().await;
}

/// A peer takes the item over while its handler runs (as in
/// `a_handler_whose_lease_was_lost_cannot_commit_its_transactional_completion`: one slot, no
/// timer polls, renewals too rare to notice): the handler's completion is fenced out.
#[tokio::test]
async fn hooks_see_the_lease_lost_when_a_peer_took_the_item() {
    let journal = Journal::default();
    let go = Arc::new(Notify::new());
    let g = go.clone();
    let env = journaled(
        handler_fn(move |_job: Job<Value>| {
            let g = g.clone();
            async move {
                g.notified().await;
                Ok(())
            }
        }),
        &journal,
        QueueSettings {
            concurrency: 1,
            lease: LeaseSettings {
                renewal_interval: Duration::from_secs(20),
                grace: Duration::from_secs(5),
                ..LeaseSettings::from_lease(Duration::from_secs(60))
            },
            ..QueueSettings::default()
        },
        ClaimConfig {
            safety_net_poll: false,
            ..ClaimConfig::default()
        },
    )
    .await;
    let mut status = env.status.clone();
    status
        .wait_for(|s| s.gate == Gate::Healthy && s.registered.is_some())
        .await
        .expect("healthy");
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    wait_until("the handler started", || journal.lines().len() == 2).await;
    env.peer_takes(id).await;
    go.notify_one();
    assert_eq!(
        journal.after_endings(1).await,
        vec!["claimed 1", "started 1", "ended 1: unavailable: lease lost"]
    );
    assert_eq!(env.state(id).await, "running", "still the peer's");
    env.stop().await;
}

#[tokio::test]
async fn hooks_see_an_eviction_of_the_instance_running_the_handler() {
    let journal = Journal::default();
    let env = journaled(
        handler_fn(|job: Job<Value>| async move {
            job.cancellation_token().cancelled().await;
            Err(JobError::cancelled("evicted"))
        }),
        &journal,
        QueueSettings::default(),
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    wait_until("the handler started", || journal.lines().len() == 2).await;
    // What the heartbeat worker does when the store says the instance was reaped.
    env.identity.evicted(env.identity.current());
    assert_eq!(
        journal.after_endings(1).await,
        vec![
            "claimed 1",
            "started 1",
            "ended 1: unavailable: instance evicted"
        ]
    );
    assert_eq!(env.state(id).await, "running", "nothing written for it");
    env.stop().await;
}

#[tokio::test]
async fn hooks_see_a_running_item_released_by_the_drain() {
    let journal = Journal::default();
    let mut env = journaled(
        handler_fn(|job: Job<Value>| async move {
            job.cancellation_token().cancelled().await;
            Err(JobError::cancelled("shutting down"))
        }),
        &journal,
        QueueSettings::default(),
        ClaimConfig {
            drain_soft_timeout_ms: 0,
            ..fast()
        },
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    wait_until("the handler started", || journal.lines().len() == 2).await;
    // Stop the workers (the database stays, to read the item after).
    env.shutdown.cancel();
    for t in env.tasks.drain(..) {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("workers stop")
            .expect("join")
            .expect("clean stop");
    }
    // The ended hook ran before the worker's run returned.
    assert_eq!(
        journal.lines(),
        vec!["claimed 1", "started 1", "ended 1: released"]
    );
    assert_eq!(env.state(id).await, "available");
}

/// A claimed hook that blocks on the first attempt only.
struct BlocksFirstClaim(Journal);

#[async_trait::async_trait]
impl JobHooks for BlocksFirstClaim {
    async fn claimed(&self, attempt: &Attempt) -> JobResult {
        self.0.claimed(attempt).await?;
        if attempt.attempt() == 1 {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    fn started(&self, attempt: &Attempt) {
        self.0.started(attempt);
    }
    async fn ended(&self, attempt: &Attempt, ending: &Ending) {
        self.0.ended(attempt, ending).await;
    }
}

#[tokio::test]
async fn a_claimed_hook_that_blocks_past_max_duration_is_stopped_and_the_attempt_fails_naming_it() {
    let journal = Journal::default();
    let hooks = BlocksFirstClaim(journal.clone());
    let env = setup_with(
        move |handlers| {
            handlers
                .add(
                    "q",
                    handler_fn(|_job: Job<Value>| async move { Ok(()) }),
                    QueueSettings {
                        lease: LeaseSettings {
                            max_duration: Some(Duration::from_secs(1)),
                            ..short_lease()
                        },
                        backoff: quick_backoff(),
                        ..QueueSettings::default()
                    },
                )
                .expect("handler")
                .hooks(hooks);
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    let errors = env.errors(id).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0]["error"],
        "the handler was stopped: exceeded max_duration (1s)"
    );
    assert_eq!(
        journal.after_endings(2).await,
        vec![
            "claimed 1",
            "ended 1: failed (will be retried): the handler was stopped: exceeded max_duration (1s)",
            "claimed 2",
            "started 2",
            "ended 2: completed",
        ]
    );
    env.stop().await;
}

#[tokio::test]
async fn a_claimed_hook_that_fails_fails_the_attempt_without_running_the_handler() {
    struct Refuses;
    #[async_trait::async_trait]
    impl JobHooks for Refuses {
        async fn claimed(&self, attempt: &Attempt) -> JobResult {
            if attempt.attempt() == 1 {
                return Err(JobError::retry("not yet"));
            }
            Ok(())
        }
    }
    let journal = Journal::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (r, j) = (runs.clone(), journal.clone());
    let env = setup_with(
        move |handlers| {
            handlers
                .add(
                    "q",
                    handler_fn(move |_job: Job<Value>| {
                        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move { Ok(()) }
                    }),
                    QueueSettings {
                        backoff: quick_backoff(),
                        ..QueueSettings::default()
                    },
                )
                .expect("handler")
                .hooks(j)
                .hooks(Refuses);
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    // The journal's claimed hook runs first; the refusal then stops the attempt before
    // any started hook or the handler.
    assert_eq!(
        journal.after_endings(2).await,
        vec![
            "claimed 1",
            "ended 1: failed (will be retried): not yet",
            "claimed 2",
            "started 2",
            "ended 2: completed",
        ]
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    env.stop().await;
}

#[tokio::test]
async fn a_timeout_layer_on_a_slow_handler_ends_the_attempt_as_a_failed_attempt_retried() {
    use tower::ServiceBuilder;
    let slow = handler_fn(|job: Job<Value>| async move {
        if job.attempt() == 1 {
            // Never finishes on its own: only the timeout layer ends this attempt.
            std::future::pending::<()>().await;
        }
        Ok(())
    });
    let env = setup(
        service_handler(
            ServiceBuilder::new()
                .timeout(Duration::from_millis(200))
                .service(slow.into_service()),
        ),
        QueueSettings {
            backoff: quick_backoff(),
            ..QueueSettings::default()
        },
        fast(),
    )
    .await;
    let id = env.enqueue(vec![NewWork::new("q", json!({}))]).await[0];
    env.wait_for_state(id, "completed").await;
    let errors = env.errors(id).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0]["error"],
        "the handler's service failed: request timed out"
    );
    assert_eq!(errors[0]["kind"], "failed");
    env.stop().await;
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {}
impl JobArgs for Ping {
    const KIND: &'static str = "ping";
    const QUEUE: &'static str = "q";
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Pong {}
impl JobArgs for Pong {
    const KIND: &'static str = "pong";
    const QUEUE: &'static str = "q";
}

#[tokio::test]
async fn a_layer_over_every_handler_sees_every_attempt_of_every_kind() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let env = setup_with(
        move |handlers| {
            let settings = QueueSettings::default();
            handlers
                .layer(tower::util::MapRequestLayer::new(move |job: Job<Value>| {
                    s.lock().unwrap().push(format!(
                        "{} #{}",
                        job.kind().unwrap_or("-"),
                        job.attempt()
                    ));
                    job
                }))
                .add_job(
                    handler_fn(|_job: Job<Ping>| async move { Ok(()) }),
                    settings,
                )
                .expect("ping")
                .add_job(
                    handler_fn(|_job: Job<Pong>| async move { Ok(()) }),
                    settings,
                )
                .expect("pong");
        },
        fast(),
    )
    .await;
    let mut items: Vec<NewWork> = (0..3).map(|_| Ping {}.into_work().unwrap()).collect();
    items.extend((0..2).map(|_| Pong {}.into_work().unwrap()));
    for id in env.enqueue(items).await {
        env.wait_for_state(id, "completed").await;
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        vec!["ping #1", "ping #1", "ping #1", "pong #1", "pong #1"]
    );
    env.stop().await;
}

#[tokio::test]
async fn a_concurrency_limit_layer_on_one_kind_holds_below_the_queue_concurrency() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use tower::ServiceBuilder;
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), max.clone());
    let ping = handler_fn(move |_job: Job<Ping>| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            let running = n.fetch_add(1, SeqCst) + 1;
            m.fetch_max(running, SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            n.fetch_sub(1, SeqCst);
            Ok(())
        }
    });
    let env = setup_with(
        move |handlers| {
            handlers
                .add_job(
                    service_handler(
                        ServiceBuilder::new()
                            .concurrency_limit(2)
                            .service(ping.into_service()),
                    ),
                    QueueSettings {
                        concurrency: 8,
                        ..QueueSettings::default()
                    },
                )
                .expect("ping");
        },
        fast(),
    )
    .await;
    let items: Vec<NewWork> = (0..10).map(|_| Ping {}.into_work().unwrap()).collect();
    for id in env.enqueue(items).await {
        env.wait_for_state(id, "completed").await;
    }
    let max = max.load(SeqCst);
    assert!(
        (1..=2).contains(&max),
        "{max} handlers ran at once under a limit of 2"
    );
    env.stop().await;
}
