//! Lease handles and the renewal worker against the in-memory coordinator, under paused tokio
//! time: cadences, deadlines and timeouts are asserted to the instant.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, CleanupStaleInstancesParams, Condition, EnqueueWorkParams,
    FakeCoordinator, Fence, InstanceId, Method, NewWork, RecordHeartbeatParams,
    RegisterQueueParams, WorkCoordinator, Worker,
};
use workpump_lease_renewal::{
    CancelReason, LeaseConfig, LeaseHandle, LeaseRenewalWorker, LeaseSettings, Leases,
};

const LEASE: Duration = Duration::from_secs(60);
const WINDOW: Duration = Duration::from_millis(200);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

struct Rig {
    fake: FakeCoordinator,
    worker: Arc<LeaseRenewalWorker>,
    leases: Leases,
    instance: InstanceId,
    host: CancellationToken,
}

async fn rig_with(config: LeaseConfig) -> Rig {
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("register queue");
    let instance = InstanceId::new();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance,
        host: "test".into(),
        metadata: json!({}),
        stale_after: Duration::from_secs(30),
        dead_after: None,
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await
    .expect("heartbeat");
    let worker = Arc::new(LeaseRenewalWorker::new(Arc::new(fake.clone()), config));
    Rig {
        leases: worker.leases(),
        fake,
        worker,
        instance,
        host: CancellationToken::new(),
    }
}

async fn rig() -> Rig {
    rig_with(LeaseConfig::default()).await
}

impl Rig {
    /// Enqueues and claims `n` items; returns their fences and the claim's send time.
    async fn claim(&self, n: usize) -> (Vec<Fence>, Instant) {
        self.fake
            .enqueue_work(EnqueueWorkParams {
                items: (0..n)
                    .map(|i| NewWork::new("q", json!({ "n": i })))
                    .collect(),
            })
            .await
            .expect("enqueue");
        let sent_at = Instant::now();
        let claimed = self
            .fake
            .claim_work(ClaimWorkParams {
                instance: self.instance,
                queues: vec!["q".into()],
                max_items: n as u32,
                lease: LEASE,
                async_commit: false,
            })
            .await
            .expect("claim");
        assert_eq!(claimed.items.len(), n);
        (claimed.items.iter().map(|c| c.fence).collect(), sent_at)
    }

    async fn handle(&self, settings: LeaseSettings) -> LeaseHandle {
        let (fences, sent_at) = self.claim(1).await;
        self.leases
            .register(self.instance, fences[0], sent_at, settings, &self.host)
    }

    fn start(&self) -> (CancellationToken, JoinHandle<()>) {
        let shutdown = CancellationToken::new();
        let worker = self.worker.clone();
        let token = shutdown.clone();
        let run = tokio::spawn(async move {
            worker.run(token).await.expect("the worker runs");
        });
        (shutdown, run)
    }

    fn renew_calls(&self) -> Vec<(Duration, usize)> {
        let origin = self.origin();
        self.fake
            .calls_of(Method::RenewLeases)
            .iter()
            .map(|c| (c.at - origin, c.items))
            .collect()
    }

    fn origin(&self) -> Instant {
        // Every test measures from its first claim's send, recorded in the fake's call log.
        self.fake.calls_of(Method::ClaimWork)[0].at
    }
}

/// Registers `n` handles on items claimed together, starts the worker, and requests their
/// renewals three a millisecond, each seen by the worker before the next is sent (as when the
/// items of one claim fall due together while the worker runs beside their guards); returns
/// the calls made within a second (time since the first request, items) and the handles with
/// the first request's instant.
async fn burst(rig: &Rig, n: usize) -> (Vec<(Duration, usize)>, Vec<LeaseHandle>, Instant) {
    let (fences, sent_at) = rig.claim(n).await;
    let t0 = Instant::now();
    let handles: Vec<LeaseHandle> = fences
        .iter()
        .map(|f| {
            rig.leases.register(
                rig.instance,
                *f,
                sent_at,
                LeaseSettings::default(),
                &rig.host,
            )
        })
        .collect();
    let ms = Duration::from_millis(1);
    for (i, h) in handles.iter().enumerate() {
        sleep_until(t0 + ms * (i / 3) as u32).await;
        assert!(h.request_renewal());
        tokio::task::yield_now().await;
    }
    sleep_until(t0 + secs(1.0)).await;
    let calls = rig
        .fake
        .calls_of(Method::RenewLeases)
        .iter()
        .map(|c| (c.at - t0, c.items))
        .collect();
    (calls, handles, t0)
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_out_in_full_batches_and_its_remainder_at_the_windows_end() {
    let rig = rig().await;
    let (shutdown, run) = rig.start();
    let (calls, handles, t0) = burst(&rig, 450).await;
    let ms = Duration::from_millis(1);
    // The 200th request (at 66 ms) and the 400th (at 133 ms) each fill a batch, sent at once;
    // the 401st (also at 133 ms) opens a window that closes 200 ms later with the last 50.
    // Before the default threshold followed max_batch (it was 100), the worker sent a batch
    // as soon as it had seen 100: five calls for these 450 instead of three.
    assert_eq!(
        calls,
        vec![(ms * 66, 200), (ms * 133, 200), (ms * 133 + WINDOW, 50)],
        "calls (time since the first request, items)"
    );
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.renewals(), 1);
        let call_at = match i {
            0..200 => t0 + ms * 66,
            200..400 => t0 + ms * 133,
            _ => t0 + ms * 133 + WINDOW,
        };
        assert_eq!(h.deadline(), call_at + LEASE, "handle {i}");
    }
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_lower_flush_at_sends_that_many_at_once() {
    let rig = rig_with(LeaseConfig {
        flush_at: Some(100),
        ..LeaseConfig::default()
    })
    .await;
    let (shutdown, run) = rig.start();
    let (calls, _handles, _) = burst(&rig, 150).await;
    // The 100th request (at 33 ms) sends at once; the 101st (also at 33 ms) opens a new
    // window that closes 200 ms later with the remaining 50.
    let ms = Duration::from_millis(1);
    assert_eq!(
        calls,
        vec![(ms * 33, 100), (ms * 33 + WINDOW, 50)],
        "calls (time since the first request, items)"
    );
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn the_seventh_renewal_under_a_cap_of_six_is_never_sent_and_the_fence_names_the_cap() {
    let rig = rig().await;
    let settings = LeaseSettings {
        max_renewals: Some(6),
        ..LeaseSettings::default()
    };
    let h = rig.handle(settings).await;
    let (shutdown, run) = rig.start();
    h.guard().await;
    let t0 = rig.origin();
    // Renewal k is requested at 20k s and sent when its window closes, 200 ms later.
    let expected: Vec<(Duration, usize)> = (1..=6)
        .map(|k| (secs(20.0 * k as f64) + WINDOW, 1))
        .collect();
    assert_eq!(rig.renew_calls(), expected);
    assert_eq!(h.renewals(), 6);
    // The 7th request (at 140 s) was skipped; the lease lapsed and the fence fired at the last
    // deadline (sent 120.2 s + 60 s) minus the grace (10 s).
    assert_eq!(Instant::now() - t0, secs(170.2));
    assert_eq!(h.deadline() - t0, secs(180.2));
    assert_eq!(
        h.cancel_reason(),
        Some(CancelReason::MaxRenewals { limit: 6 })
    );
    assert_eq!(
        h.renewals_stopped(),
        Some(CancelReason::MaxRenewals { limit: 6 })
    );
    assert_eq!(
        h.cancel_reason().map(|r| r.to_string()).as_deref(),
        Some("exceeded max_renewals (6)")
    );
    assert_eq!(rig.fake.work_row(h.fence().id).expect("row").renewals, 6);
    // Nothing else goes out for it afterwards.
    sleep(secs(120.0)).await;
    assert_eq!(rig.renew_calls().len(), 6);
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn the_token_fires_at_exactly_deadline_minus_grace_when_every_renewal_call_fails() {
    let rig = rig().await;
    rig.fake.fail_next(Method::RenewLeases, 1_000);
    let h = rig.handle(LeaseSettings::default()).await;
    let (shutdown, run) = rig.start();
    h.guard().await;
    let t0 = rig.origin();
    assert_eq!(Instant::now() - t0, secs(50.0));
    assert_eq!(h.cancel_reason(), Some(CancelReason::LeaseFence));
    assert_eq!(
        h.deadline() - t0,
        LEASE,
        "a failed call never moves the deadline"
    );
    assert_eq!(h.renewals(), 0);
    // Both ticks before the fence were tried; a failed call is not a lost lease.
    assert_eq!(rig.renew_calls(), vec![(secs(20.2), 1), (secs(40.2), 1)]);
    assert!(h.is_expired());
    // The worker reports the failing calls: degraded, two in a row, with the error.
    match rig.worker.health().condition() {
        Condition::Degraded {
            last_error,
            failures,
            ..
        } => {
            assert_eq!(failures, 2);
            assert!(
                last_error.starts_with("renewing 1 leases: "),
                "{last_error}"
            );
        }
        other => panic!("expected degraded, got {other:?}"),
    }
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn is_expired_turns_true_exactly_at_deadline_minus_grace() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let t0 = rig.origin();
    // tokio's timer has millisecond resolution: the last millisecond before the fence.
    sleep_until(t0 + secs(49.999)).await;
    assert!(!h.is_expired());
    sleep_until(t0 + secs(50.0)).await;
    assert!(h.is_expired());
    // It needs no guard and no worker: the token has not fired, the check is still exact.
    assert!(!h.token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_reported_lost_fires_the_token_within_the_same_flush() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    // Another claim took the item over: the lease was released in the store and reclaimed.
    rig.fake.release_lease(h.fence().id);
    let other = InstanceId::new();
    rig.fake
        .record_heartbeat(RecordHeartbeatParams {
            instance: other,
            host: "peer".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: None,
            lock_grace: None,
            alive_lock: AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .expect("heartbeat");
    let taken = rig
        .fake
        .claim_work(ClaimWorkParams {
            instance: other,
            queues: vec!["q".into()],
            max_items: 1,
            lease: LEASE,
            async_commit: false,
        })
        .await
        .expect("reclaim");
    assert_eq!(taken.items.len(), 1);
    assert!(h.request_renewal());
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.calls, counts.lost, counts.renewed), (1, 1, 0));
    assert!(h.token().is_cancelled());
    assert_eq!(h.cancel_reason(), Some(CancelReason::LeaseLost));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_of_an_evicted_instance_fires_the_token_as_evicted() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    // A sweep reaps the instance (its heartbeat went stale): it is deleted and tombstoned.
    rig.fake
        .age_heartbeat(rig.instance, Duration::from_secs(3600));
    // The sweeping peer has watched the store for longer than that.
    rig.fake.age_connections(Duration::from_secs(7200));
    let reaped = rig
        .fake
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: None,
            stale_after: Duration::from_secs(30),
            dead_after: None,
            lock_grace: None,
        })
        .await
        .expect("sweep");
    assert_eq!(reaped.reaped.len(), 1);
    assert!(h.request_renewal());
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!(
        (counts.calls, counts.evicted, counts.lost, counts.renewed),
        (1, 1, 0, 0)
    );
    assert!(h.token().is_cancelled());
    assert_eq!(h.cancel_reason(), Some(CancelReason::Evicted));
}

#[tokio::test(start_paused = true)]
async fn a_cancel_request_in_the_renewal_reply_fires_the_token() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let reader = h.reason_reader();
    rig.fake.request_cancel(h.fence().id);
    assert!(h.request_renewal());
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.calls, counts.renewed), (1, 1));
    assert!(h.token().is_cancelled());
    assert_eq!(reader.get(), Some(CancelReason::CancelRequested));
}

#[tokio::test(start_paused = true)]
async fn a_hung_call_is_abandoned_at_the_shortest_remaining_lease_and_the_next_batch_goes_out() {
    let rig = rig().await;
    let a = rig.handle(LeaseSettings::default()).await;
    let t0 = rig.origin();
    sleep_until(t0 + secs(15.0)).await;
    let b = rig.handle(LeaseSettings::default()).await;
    rig.fake.hang_next(Method::RenewLeases, 1);
    let (shutdown, run) = rig.start();

    sleep_until(t0 + secs(20.0)).await;
    assert!(a.request_renewal());
    sleep_until(t0 + secs(35.0)).await;
    assert!(b.request_renewal());
    sleep_until(t0 + secs(59.999)).await;
    assert_eq!(
        rig.renew_calls(),
        vec![(secs(20.2), 1)],
        "B waits behind the hung call"
    );
    sleep_until(t0 + secs(61.0)).await;
    // A's call (sent at 20.2 s, A's deadline 60 s) was given up at 60 s; B went out then.
    assert_eq!(rig.renew_calls(), vec![(secs(20.2), 1), (secs(60.0), 1)]);
    assert_eq!(b.renewals(), 1);
    assert_eq!(b.deadline() - t0, secs(120.0));
    assert_eq!(a.renewals(), 0);

    // The hung call's late reply still lands: A's lease expired in the store meanwhile.
    rig.fake.release_hangs();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(a.cancel_reason(), Some(CancelReason::LeaseLost));
    assert_eq!(b.cancel_reason(), None);
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn with_one_call_abandoned_a_second_timeout_waits_for_a_call_to_finish_before_sending_more() {
    let rig = rig().await;
    let a = rig.handle(LeaseSettings::default()).await;
    let t0 = rig.origin();
    sleep_until(t0 + secs(15.0)).await;
    let b = rig.handle(LeaseSettings::default()).await;
    rig.fake.hang_next(Method::RenewLeases, 2);
    let (shutdown, run) = rig.start();

    sleep_until(t0 + secs(20.0)).await;
    assert!(a.request_renewal()); // sent 20.2 s, hangs, abandoned at 60 s (A's deadline)
    sleep_until(t0 + secs(30.0)).await;
    let c = rig.handle(LeaseSettings::default()).await;
    sleep_until(t0 + secs(35.0)).await;
    assert!(b.request_renewal()); // sent 60 s, hangs, times out at 75 s (B's deadline)
    sleep_until(t0 + secs(65.0)).await;
    assert!(c.request_renewal()); // must wait from 75 s on: two calls are out
    sleep_until(t0 + secs(77.999)).await;
    assert_eq!(
        rig.renew_calls(),
        vec![(secs(20.2), 1), (secs(60.0), 1)],
        "no third call while two are hung"
    );
    sleep_until(t0 + secs(78.0)).await;
    rig.fake.release_hangs();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        rig.renew_calls(),
        vec![(secs(20.2), 1), (secs(60.0), 1), (secs(78.0), 1)]
    );
    assert_eq!(c.deadline() - t0, secs(138.0));
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_moves_to_the_calls_send_time_plus_the_lease_not_the_replys() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let t0 = rig.origin();
    rig.fake.hang_next(Method::RenewLeases, 1);
    let (shutdown, run) = rig.start();
    assert!(h.request_renewal());
    sleep_until(t0 + secs(5.0)).await;
    assert_eq!(h.renewals(), 0);
    assert_eq!(h.deadline() - t0, LEASE);
    // The store renews at 5 s (its lease now ends at 65 s), but the call left at 0.2 s.
    rig.fake.release_hangs();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(h.renewals(), 1);
    assert_eq!(h.deadline() - t0, secs(60.2));
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_late_reply_never_moves_a_deadline_backwards_nor_revives_a_fenced_handle() {
    let rig = rig().await;
    sleep(secs(100.0)).await;
    let (fences, sent_at) = rig.claim(2).await;
    let t0 = sent_at;
    let settings = LeaseSettings::default();
    let a = rig
        .leases
        .register(rig.instance, fences[0], t0, settings, &rig.host);
    // X's claim left 45 s ago by the local clock: its deadline is 15 s away, its fence 5 s.
    let x = Arc::new(rig.leases.register(
        rig.instance,
        fences[1],
        t0 - secs(45.0),
        settings,
        &rig.host,
    ));
    let x_guard = tokio::spawn({
        let x = x.clone();
        async move { x.guard().await }
    });
    rig.fake.hang_next(Method::RenewLeases, 1);
    let (shutdown, run) = rig.start();
    assert!(a.request_renewal());
    assert!(x.request_renewal());
    // The call (A and X, sent 0.2 s) hangs; X's deadline bounds it: abandoned at 15 s.
    sleep_until(t0 + secs(16.0)).await;
    assert_eq!(x.cancel_reason(), Some(CancelReason::LeaseFence));
    assert!(a.request_renewal());
    sleep_until(t0 + secs(17.0)).await;
    assert_eq!(a.renewals(), 1);
    assert_eq!(a.deadline() - t0, secs(76.2));
    // Now the first call returns: the store renews both (their leases are still live there).
    rig.fake.release_hangs();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        rig.fake.work_row(fences[0].id).expect("row").renewals,
        2,
        "the late call did renew A in the store"
    );
    assert_eq!(a.deadline() - t0, secs(76.2), "not back to 60.2 s");
    assert_eq!(a.renewals(), 2);
    assert_eq!(
        x.deadline() - t0,
        secs(15.0),
        "a fenced handle stays fenced"
    );
    assert_eq!(x.renewals(), 0);
    assert!(x.is_expired());
    x_guard.await.expect("guard ends");
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_late_reply_for_an_old_claim_leaves_the_newer_claim_and_disposed_handles_alone() {
    let rig = rig().await;
    let (fences, t0) = rig.claim(2).await;
    let settings = LeaseSettings::default();
    let old = rig
        .leases
        .register(rig.instance, fences[0], t0, settings, &rig.host);
    let gone = rig
        .leases
        .register(rig.instance, fences[1], t0, settings, &rig.host);
    let gone_reader = gone.reason_reader();
    rig.fake.hang_next(Method::RenewLeases, 1);
    assert!(old.request_renewal());
    assert!(gone.request_renewal());
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.calls, counts.abandoned_calls), (1, 1));
    assert_eq!(
        Instant::now() - t0,
        LEASE,
        "given up at the shortest remaining lease"
    );
    drop(gone);

    // The item is reclaimed under a new token; the new claim gets its own handle.
    rig.fake.release_lease(fences[0].id);
    let reclaimed = rig
        .fake
        .claim_work(ClaimWorkParams {
            instance: rig.instance,
            queues: vec!["q".into()],
            max_items: 1,
            lease: LEASE,
            async_commit: false,
        })
        .await
        .expect("reclaim");
    let new_fence = reclaimed.items[0].fence;
    assert_eq!(new_fence.id, fences[0].id);
    assert_ne!(new_fence.token, fences[0].token);
    let new = rig
        .leases
        .register(rig.instance, new_fence, Instant::now(), settings, &rig.host);
    let new_deadline = new.deadline();

    rig.fake.release_hangs();
    sleep(Duration::from_millis(1)).await;
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.late, counts.calls), (2, 0));
    assert_eq!(old.cancel_reason(), Some(CancelReason::LeaseLost));
    assert_eq!(new.cancel_reason(), None);
    assert!(!new.token().is_cancelled());
    assert_eq!(new.deadline(), new_deadline);
    assert_eq!(new.renewals(), 0);
    assert_eq!(gone_reader.get(), Some(CancelReason::Disposed));
}

#[tokio::test(start_paused = true)]
async fn max_duration_fires_the_token_and_stops_renewals() {
    let rig = rig().await;
    let settings = LeaseSettings {
        max_duration: Some(secs(45.0)),
        ..LeaseSettings::default()
    };
    let h = rig.handle(settings).await;
    let (shutdown, run) = rig.start();
    h.guard().await;
    assert_eq!(Instant::now() - h.started_at(), secs(45.0));
    let reason = CancelReason::MaxDuration { limit: secs(45.0) };
    assert_eq!(h.cancel_reason(), Some(reason));
    assert_eq!(reason.to_string(), "exceeded max_duration (45s)");
    assert_eq!(h.renewals(), 2, "renewed at 20 s and 40 s until then");
    assert!(!h.request_renewal(), "no renewal after the token fired");
    shutdown.cancel();
    run.await.expect("run ends");

    // A request that reaches the worker after max_duration is skipped, naming the limit.
    let late = rig.handle(settings).await;
    sleep(secs(45.0)).await;
    assert!(late.request_renewal());
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.skipped_max_duration, counts.calls), (1, 0));
    assert_eq!(late.renewals_stopped(), Some(reason));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_fires_disposed_and_the_worker_skips_it() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let token = h.token();
    let reader = h.reason_reader();
    assert!(h.request_renewal());
    drop(h);
    assert!(token.is_cancelled());
    assert_eq!(reader.get(), Some(CancelReason::Disposed));
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!((counts.skipped_disposed, counts.calls), (1, 0));
    assert!(rig.fake.calls_of(Method::RenewLeases).is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_first_cancel_reason_wins_and_a_parent_shutdown_reads_as_shutdown() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    h.cancel(CancelReason::Evicted);
    h.cancel(CancelReason::LeaseLost);
    assert_eq!(h.cancel_reason(), Some(CancelReason::Evicted));

    let g = rig.handle(LeaseSettings::default()).await;
    rig.host.cancel();
    g.guard().await; // returns at once: the parent fired
    assert_eq!(g.cancel_reason(), Some(CancelReason::Shutdown));
    drop(g);
    assert_eq!(h.cancel_reason(), Some(CancelReason::Evicted));
}

#[tokio::test(start_paused = true)]
async fn a_full_channel_refuses_the_request_and_the_next_tick_retries() {
    let rig = rig_with(LeaseConfig {
        channel_capacity: 1,
        ..LeaseConfig::default()
    })
    .await;
    let a = rig.handle(LeaseSettings::default()).await;
    let b = rig.handle(LeaseSettings::default()).await;
    assert!(a.request_renewal());
    assert!(!b.request_renewal(), "the channel holds one request");
    assert!(!a.request_renewal(), "A already has one pending");
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!(counts.renewed, 1);
    assert!(b.request_renewal(), "room again");
    let counts = rig.worker.run_once().await.expect("flush");
    assert_eq!(counts.renewed, 1);
    assert_eq!((a.renewals(), b.renewals()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_request_pending_when_the_worker_stops_goes_out_after_it_restarts() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let (shutdown, run) = rig.start();
    let t = Instant::now();
    assert!(h.request_renewal());
    sleep(Duration::from_millis(100)).await; // inside the window
    shutdown.cancel();
    run.await.expect("run ends");
    assert!(rig.fake.calls_of(Method::RenewLeases).is_empty());
    let (shutdown, run) = rig.start();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(h.renewals(), 1);
    let calls = rig.fake.calls_of(Method::RenewLeases);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].at - t,
        WINDOW,
        "the window still counts from the request"
    );
    shutdown.cancel();
    run.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn start_cancel_and_restart_fifty_times_leaves_no_task_behind() {
    let rig = rig().await;
    let h = rig.handle(LeaseSettings::default()).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    for i in 0..50 {
        if i % 2 == 1 {
            // Half the runs stop with a call hanging in flight.
            rig.fake.hang_next(Method::RenewLeases, 1);
            assert!(h.request_renewal());
        }
        let (shutdown, run) = rig.start();
        sleep(Duration::from_millis(300)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("run returns promptly after cancel")
            .expect("run ends cleanly");
        assert_eq!(metrics.num_alive_tasks(), baseline, "iteration {i}");
        rig.fake.release_hangs();
    }
    assert_eq!(rig.fake.calls_of(Method::RenewLeases).len(), 25);
    assert!(!h.token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_second_concurrent_run_is_refused() {
    let rig = rig().await;
    let (shutdown, run) = rig.start();
    sleep(Duration::from_millis(1)).await;
    let err = rig
        .worker
        .run(CancellationToken::new())
        .await
        .expect_err("already running");
    assert!(err.to_string().contains("already running"), "{err}");
    assert!(rig.worker.run_once().await.is_err());
    shutdown.cancel();
    run.await.expect("run ends");
    assert_eq!(rig.worker.name(), "lease-renewal");
}

#[tokio::test(start_paused = true)]
async fn a_tick_that_finds_the_channel_full_tries_again_within_fifty_milliseconds() {
    let rig = rig_with(LeaseConfig {
        channel_capacity: 1,
        ..LeaseConfig::default()
    })
    .await;
    // Two handles whose renewal ticks coincide; the channel holds one request.
    let a = rig.handle(LeaseSettings::default()).await;
    let b = rig.handle(LeaseSettings::default()).await;
    let (shutdown, run) = rig.start();
    let interval = LeaseSettings::default().renewal_interval;
    tokio::select! {
        _ = a.guard() => panic!("a's lease fired"),
        _ = b.guard() => panic!("b's lease fired"),
        // The tick, the retry 50 ms later, and the coalescing window.
        _ = sleep(interval + Duration::from_millis(50) + WINDOW + Duration::from_millis(10)) => {}
    }
    assert_eq!(
        (a.renewals(), b.renewals()),
        (1, 1),
        "the refused request was queued again within the same interval"
    );
    shutdown.cancel();
    run.await.expect("run ends");
}
