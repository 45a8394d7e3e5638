//! The builder resolves queue settings at start, refuses duplicate handlers, hands every
//! worker factory one context, and `ready()` resolves once the host is ready. On the
//! in-memory store: no database needed.

mod support;

use std::sync::Arc;
use std::time::Duration;

use workpump_coordinator::testing::Logs;
use workpump_coordinator::FakeCoordinator;
use workpump_host::{handler_fn, Host, HostError, Job, QueueConfig};

use support::Idle;

fn noop() -> impl workpump_host::Handler {
    handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) })
}

#[tokio::test]
async fn settings_changed_after_a_handler_was_added_still_apply_to_it() {
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .configure(|c| {
            c.queues.insert(
                "q".into(),
                QueueConfig {
                    concurrency: Some(0),
                    ..QueueConfig::default()
                },
            );
        })
        .start()
        .await
        .err()
        .expect("refused");
    match err {
        HostError::Config(problems) => {
            assert!(
                problems.iter().any(|p| p.setting == "queues.q.concurrency"),
                "{problems:?}"
            );
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn two_untyped_handlers_for_one_queue_are_refused() {
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .handler("q", noop())
        .start()
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("queue \"q\" has more than one untyped handler"),
        "{err}"
    );
}

#[tokio::test]
async fn ready_resolves_once_the_host_is_ready_and_the_host_stays_live() {
    let host = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .start()
        .await
        .expect("start");
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");
    let health = host.health();
    assert!(
        health.ready && health.live && health.schema_ready,
        "{health}"
    );
    host.shutdown();
    tokio::time::timeout(Duration::from_secs(10), host.stopped())
        .await
        .expect("stopped in time")
        .expect("clean stop");
    let err = host.ready().await.unwrap_err();
    assert!(err.to_string().contains("stopped"), "{err}");
}

/// What one factory saw in its context.
#[derive(Debug)]
struct Seen {
    slot: &'static str,
    instance: workpump_host::InstanceId,
    /// The lease tracker's address, if it had one.
    tracker: Option<usize>,
    queues: Vec<(String, usize)>,
    liveness: workpump_host::Liveness,
    heartbeat: workpump_host::HeartbeatConfig,
    host_name: String,
    shutdown_timeout: Duration,
    /// The claim configuration's drain timeout and poll base.
    claim: (u64, u64),
}

/// An `Arc`'s address, to tell whether two are the same allocation.
fn address<T: ?Sized>(arc: &Arc<T>) -> usize {
    Arc::as_ptr(arc).cast::<()>() as usize
}

fn seen(slot: &'static str, ctx: &workpump_host::WorkerContext) -> Seen {
    Seen {
        slot,
        instance: ctx.identity().current(),
        tracker: ctx.lease_tracker().map(|t| address(&t)),
        queues: ctx
            .handlers()
            .queues()
            .map(|(q, s)| (q.to_owned(), s.concurrency))
            .collect(),
        liveness: *ctx.liveness(),
        heartbeat: ctx.config().heartbeat.clone(),
        host_name: ctx.host_name().to_owned(),
        shutdown_timeout: ctx.shutdown_timeout(),
        claim: {
            let c = ctx.claim_config();
            (c.drain_timeout_ms, c.poll_base_ms)
        },
    }
}

#[tokio::test]
async fn every_factory_is_handed_one_context_and_the_lease_slot_supplies_its_tracker() {
    use std::sync::Mutex;
    use workpump_host::{coordinator::LeaseTracker, Worker, WorkerContext};

    let seen_by: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let lease_tracker: Arc<Mutex<Option<usize>>> = Arc::default();
    let record = |slot: &'static str| {
        let seen_by = seen_by.clone();
        move |ctx: &WorkerContext| {
            seen_by.lock().expect("seen").push(seen(slot, ctx));
            Arc::new(Idle(slot)) as Arc<dyn Worker>
        }
    };
    let mut config = workpump_host::HostConfig {
        host_name: Some("swap-test".into()),
        shutdown_timeout_ms: 1_234,
        ..workpump_host::HostConfig::default()
    };
    config.liveness.stale_after = Duration::from_secs(21);
    config.heartbeat.fast_interval_ms = 7_000;
    config.queues.insert(
        "q".into(),
        QueueConfig {
            concurrency: Some(3),
            ..QueueConfig::default()
        },
    );
    let host = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .config(config.clone())
        .handler("q", noop())
        .claim_worker(record("claim"))
        .heartbeat_worker(record("heartbeat"))
        .maintenance_worker(record("maintenance"))
        .lease_worker({
            let (seen_by, lease_tracker) = (seen_by.clone(), lease_tracker.clone());
            move |ctx: &WorkerContext| {
                seen_by.lock().expect("seen").push(seen("lease", ctx));
                let worker = workpump_lease_renewal::LeaseRenewalWorker::new(
                    ctx.coordinator(),
                    ctx.lease_config(),
                );
                let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
                *lease_tracker.lock().expect("tracker") = Some(address(&tracker));
                (Arc::new(worker) as Arc<dyn Worker>, tracker)
            }
        })
        .start()
        .await
        .expect("start");

    let seen_by = std::mem::take(&mut *seen_by.lock().expect("seen"));
    let slots: Vec<&str> = seen_by.iter().map(|s| s.slot).collect();
    assert_eq!(slots.len(), 4, "each factory was called once: {slots:?}");
    assert_eq!(
        slots[0], "lease",
        "the lease slot first: it supplies the tracker"
    );
    let tracker = lease_tracker.lock().expect("tracker").expect("a tracker");
    for s in &seen_by {
        assert_eq!(
            s.instance,
            host.instance(),
            "{}: the host's identity",
            s.slot
        );
        let expected_tracker = if s.slot == "lease" {
            None
        } else {
            Some(tracker)
        };
        assert_eq!(
            s.tracker, expected_tracker,
            "{}: the lease slot's tracker",
            s.slot
        );
        assert_eq!(
            s.queues,
            vec![("q".to_owned(), 3)],
            "{}: the handlers",
            s.slot
        );
        assert_eq!(
            s.liveness,
            workpump_host::Liveness {
                stale_after: Duration::from_secs(21),
                ..workpump_host::Liveness::default()
            },
            "{}: the one set of liveness cutoffs",
            s.slot
        );
        assert_eq!(
            s.heartbeat.fast_interval_ms, 7_000,
            "{}: the heartbeat's cadences",
            s.slot
        );
        assert_eq!(s.host_name, "swap-test", "{}", s.slot);
        assert_eq!(
            s.shutdown_timeout,
            Duration::from_millis(1_234),
            "{}",
            s.slot
        );
        assert_eq!(
            s.claim,
            (1_234, config.claim.poll_base_ms),
            "{}: `[claim]` with the host's shutdown timeout as the drain timeout",
            s.slot
        );
    }
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");
    let mut running: Vec<String> = host
        .health()
        .workers
        .iter()
        .filter(|w| w.running)
        .map(|w| w.name.clone())
        .collect();
    running.sort();
    assert_eq!(
        running,
        ["claim", "heartbeat", "lease-renewal", "maintenance"]
    );
    host.shutdown();
    tokio::time::timeout(Duration::from_secs(10), host.stopped())
        .await
        .expect("stopped in time")
        .expect("clean stop");
}

/// A host that only enqueues declares its queues without handlers, as its service; a queue
/// another service declared first keeps that service's settings.
#[tokio::test]
async fn a_producer_only_host_declares_its_queues_and_keeps_another_services_settings() {
    use workpump_coordinator::{
        NewWork, Operations, QueueOverviewParams, RegisterQueueParams, WorkCoordinator,
    };
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("shared").owned_by("billing"))
        .await
        .expect("billing declares shared");
    let host = Host::builder()
        .coordinator(Arc::new(fake.clone()))
        .produces("orders")
        .produces("shared")
        .configure(|c| {
            c.service = Some("shop".into());
            for (queue, max_attempts) in [("orders", 4), ("shared", 7)] {
                c.queues.insert(
                    queue.into(),
                    QueueConfig {
                        max_attempts: Some(max_attempts),
                        ..QueueConfig::default()
                    },
                );
            }
            // The flow limits travel with the declaration, like max_attempts.
            let orders = c.queues.get_mut("orders").expect("configured above");
            orders.max_running = Some(3);
            orders.rate_limit = Some(100);
            orders.rate_period_ms = Some(1_000);
        })
        .start()
        .await
        .expect("start");
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");
    host.enqueue_many(vec![NewWork::new("orders", serde_json::json!({"id": 1}))])
        .await
        .expect("an enqueue to a produced queue is accepted");
    let overview = fake
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview");
    let orders = overview.get("orders").expect("declared");
    assert_eq!(
        (
            orders.owner.as_deref(),
            orders.max_attempts,
            orders.available
        ),
        (Some("shop"), Some(4), 1)
    );
    assert_eq!(
        (orders.max_running, orders.rate_limit),
        (
            Some(3),
            Some(workpump_coordinator::RateLimit::new(
                100,
                Duration::from_secs(1)
            ))
        )
    );
    let shared = overview.get("shared").expect("declared");
    assert_eq!(
        (shared.owner.as_deref(), shared.max_attempts),
        (Some("billing"), Some(10)),
        "billing's settings stay"
    );
    let logged = logs.text();
    assert!(
        logged.contains(
            "queue \"shared\": service \"shop\" declares max_attempts = 7, ordering_dead_head = \
             hold, max_running = unlimited, rate = unlimited, but the queue's settings belong to \
             service \"billing\" (max_attempts = 10, ordering_dead_head = hold, max_running = \
             unlimited, rate = unlimited); keeping theirs"
        ),
        "the warning names both services:\n{logged}"
    );
    assert_eq!(logged.matches("keeping theirs").count(), 1, "{logged}");
    host.shutdown();
    tokio::time::timeout(Duration::from_secs(10), host.stopped())
        .await
        .expect("stopped in time")
        .expect("clean stop");
}

#[tokio::test]
async fn a_service_name_out_of_range_is_refused_at_start() {
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .produces("q")
        .configure(|c| c.service = Some(String::new()))
        .start()
        .await
        .err()
        .expect("refused");
    match err {
        HostError::Config(problems) => {
            assert!(
                problems.iter().any(|p| p.setting == "service"),
                "{problems:?}"
            );
        }
        other => panic!("{other}"),
    }
}

/// The lease factory's configuration at the shipped `[lease]` (a channel of 5 000 renewal
/// requests): a host with more handler slots than that, 10 000 over two queues as in the
/// bench's renewal scenario, gets a channel for every one of them; a larger setting stays; a
/// host with fewer slots keeps the setting.
#[tokio::test]
async fn the_renewal_channel_holds_a_request_for_every_handler_slot_at_the_shipped_setting() {
    use std::sync::Mutex;
    use workpump_host::{coordinator::LeaseTracker, HostConfig, Worker, WorkerContext};
    use workpump_lease_renewal::{LeaseRenewalWorker, DEFAULT_CHANNEL_CAPACITY};

    let shipped = DEFAULT_CHANNEL_CAPACITY;
    assert_eq!(HostConfig::default().lease.channel_capacity, shipped);
    for (slots, setting, expected) in [
        ((6_000, 4_000), shipped, 10_000),
        ((6_000, 4_000), 20_000, 20_000),
        ((2, 3), shipped, shipped),
    ] {
        let mut config = HostConfig::default();
        config.lease.channel_capacity = setting;
        for (queue, concurrency) in [("a", slots.0), ("b", slots.1)] {
            config.queues.insert(
                queue.into(),
                QueueConfig {
                    concurrency: Some(concurrency),
                    ..QueueConfig::default()
                },
            );
        }
        let capacity: Arc<Mutex<Option<usize>>> = Arc::default();
        let host = Host::builder()
            .coordinator(Arc::new(FakeCoordinator::new()))
            .config(config)
            .handler("a", noop())
            .handler("b", noop())
            .lease_worker({
                let capacity = capacity.clone();
                move |ctx: &WorkerContext| {
                    let lease = ctx.lease_config();
                    *capacity.lock().expect("capacity") = Some(lease.channel_capacity);
                    let worker = LeaseRenewalWorker::new(ctx.coordinator(), lease);
                    let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
                    (Arc::new(worker) as Arc<dyn Worker>, tracker)
                }
            })
            .start()
            .await
            .expect("start");
        assert_eq!(
            *capacity.lock().expect("capacity"),
            Some(expected),
            "{slots:?} handler slots, channel_capacity = {setting}"
        );
        host.shutdown();
        tokio::time::timeout(Duration::from_secs(10), host.stopped())
            .await
            .expect("stopped in time")
            .expect("clean stop");
    }
}
