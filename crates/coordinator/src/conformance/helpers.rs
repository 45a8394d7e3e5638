//! What the cases share: the cutoffs they use, and short forms of the calls.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::{Harness, WorkRow};
use crate::error::{Error, Result};
use crate::types::*;

pub(super) const LEASE: Duration = Duration::from_secs(60);

pub(super) const STALE: Duration = Duration::from_secs(30);

pub(super) const DEAD: Duration = Duration::from_secs(300);

pub(super) const GRACE: Duration = Duration::from_secs(3);

pub(super) async fn queue(h: &dyn Harness, name: &str, max_attempts: i32) {
    h.coordinator()
        .register_queue(RegisterQueueParams {
            ordering_dead_head: Default::default(),
            max_running: None,
            rate_limit: None,
            name: name.into(),
            max_attempts,
            owner: None,
        })
        .await
        .expect("register queue");
}

pub(super) async fn instance(h: &dyn Harness) -> InstanceId {
    let id = InstanceId::new();
    heartbeat(h, id).await;
    id
}

/// A registration beat with the shipped cutoffs that says nothing about the lock.
pub(super) async fn heartbeat(h: &dyn Harness, id: InstanceId) -> RecordHeartbeatOutcome {
    beat(h, id, AliveLockReport::Unreported, true).await
}

pub(super) async fn beat(
    h: &dyn Harness,
    id: InstanceId,
    alive_lock: AliveLockReport,
    registering: bool,
) -> RecordHeartbeatOutcome {
    h.coordinator()
        .record_heartbeat(beat_params(id, alive_lock, registering))
        .await
        .expect("heartbeat")
}

pub(super) fn beat_params(
    id: InstanceId,
    alive_lock: AliveLockReport,
    registering: bool,
) -> RecordHeartbeatParams {
    RecordHeartbeatParams {
        instance: id,
        host: "test-host".into(),
        metadata: json!({"pid": 1}),
        stale_after: STALE,
        dead_after: Some(DEAD),
        lock_grace: Some(GRACE),
        alive_lock,
        registering,
    }
}

/// Takes `id`'s alive-lock on a session of its own; panics unless it is held.
pub(super) async fn take_lock(h: &dyn Harness, id: InstanceId) -> TakeAliveLockOutcome {
    let lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: id })
        .await
        .expect("take the alive-lock");
    assert!(lock.held, "the alive-lock of {id} is free");
    lock
}

/// The harness's judge (see [`JudgeSlot`](super::JudgeSlot)): registered, holding its lock, and watching the
/// store for longer than the definitive-dead cutoff.
pub async fn judge(h: &dyn Harness) -> InstanceId {
    let mut slot = h.judge_slot().0.lock().await;
    if let Some((id, session)) = slot.as_mut() {
        if session.retake().await.unwrap_or(false) {
            return *id;
        }
    }
    let id = instance(h).await;
    let lock = take_lock(h, id).await;
    h.age_watch(id, DEAD * 2).await;
    *slot = Some((id, lock.session));
    id
}

pub(super) async fn enqueue(h: &dyn Harness, items: Vec<NewWork>) -> Vec<WorkId> {
    h.coordinator()
        .enqueue_work(EnqueueWorkParams { items })
        .await
        .expect("enqueue")
        .items
        .into_iter()
        .map(|e| e.id)
        .collect()
}

pub(super) async fn enqueue_n(h: &dyn Harness, q: &str, n: usize) -> Vec<WorkId> {
    enqueue(
        h,
        (0..n).map(|i| NewWork::new(q, json!({ "n": i }))).collect(),
    )
    .await
}

pub(super) fn claim_params(
    instance: InstanceId,
    queues: &[&str],
    max_items: u32,
) -> ClaimWorkParams {
    ClaimWorkParams {
        instance,
        queues: queues.iter().map(|q| q.to_string()).collect(),
        max_items,
        lease: LEASE,
        async_commit: false,
    }
}

pub(super) async fn claim(
    h: &dyn Harness,
    instance: InstanceId,
    queues: &[&str],
    max: u32,
) -> ClaimWorkOutcome {
    h.coordinator()
        .claim_work(claim_params(instance, queues, max))
        .await
        .expect("claim")
}

pub(super) fn ids(outcome: &ClaimWorkOutcome) -> HashSet<WorkId> {
    outcome.items.iter().map(|c| c.fence.id).collect()
}

pub(super) async fn row(h: &dyn Harness, id: WorkId) -> WorkRow {
    h.work_row(id).await.expect("row exists")
}

pub(super) async fn renew(
    h: &dyn Harness,
    instance: InstanceId,
    leases: Vec<Fence>,
) -> Vec<Renewal> {
    h.coordinator()
        .renew_leases(RenewLeasesParams {
            instance,
            leases,
            lease: LEASE,
        })
        .await
        .expect("renew")
        .items
}

pub(super) async fn complete(
    h: &dyn Harness,
    instance: InstanceId,
    items: Vec<Fence>,
) -> OutcomeBatch {
    h.coordinator()
        .complete_work(CompleteWorkParams {
            instance,
            items,
            hand_off: Vec::new(),
        })
        .await
        .expect("complete")
}

pub(super) async fn fail(
    h: &dyn Harness,
    instance: InstanceId,
    fence: Fence,
    error: &str,
    disposition: FailDisposition,
) -> Option<WorkState> {
    h.coordinator()
        .fail_work(FailWorkParams {
            instance,
            items: vec![Failure {
                fence,
                error: error.into(),
                disposition,
            }],
        })
        .await
        .expect("fail")
        .items[0]
        .state
}

/// The maintenance sweep's step for leases that are gone (`dead_letter_expired`): releases
/// lapsed leases, then ends orphans that must not run again.
pub(super) async fn sweep_lapsed(h: &dyn Harness) -> DeadLetterExpiredOutcome {
    h.coordinator()
        .dead_letter_expired(DeadLetterExpiredParams { limit: 1000 })
        .await
        .expect("dead_letter_expired")
}

/// A sweep by the harness's judge, without the lock-lost rule.
pub(super) async fn cleanup(
    h: &dyn Harness,
    dead_after: Option<Duration>,
) -> CleanupStaleInstancesOutcome {
    let judge = judge(h).await;
    sweep_by(h, Some(judge), dead_after, None).await
}

pub(super) async fn sweep_by(
    h: &dyn Harness,
    judge: Option<InstanceId>,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> CleanupStaleInstancesOutcome {
    h.coordinator()
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge,
            stale_after: STALE,
            dead_after,
            lock_grace,
        })
        .await
        .expect("cleanup")
}

/// Claims one item that is the only available one in queue `q`.
pub(super) async fn claim_one(h: &dyn Harness, instance: InstanceId, q: &str) -> ClaimedWork {
    let out = claim(h, instance, &[q], 1).await;
    assert_eq!(out.items.len(), 1, "expected one claimed item");
    out.items.into_iter().next().expect("one item")
}

/// A sweep by the harness's judge with every rule.
pub(super) async fn sweep_with_grace(h: &dyn Harness) -> CleanupStaleInstancesOutcome {
    let judge = judge(h).await;
    sweep_by(h, Some(judge), Some(DEAD), Some(GRACE)).await
}

pub(super) async fn wait_until_not_alive(h: &dyn Harness, instance: InstanceId) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let alive = h
            .operations()
            .is_instance_alive(IsInstanceAliveParams { instance })
            .await
            .expect("alive?")
            .alive;
        if !alive {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the alive-lock of {instance} was never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) const HOUR: Duration = Duration::from_secs(3600);

pub(super) const DAY: Duration = Duration::from_secs(24 * 3600);

pub(super) fn counts(pairs: &[(&str, u64)]) -> Vec<QueueCount> {
    pairs
        .iter()
        .map(|(q, n)| QueueCount {
            queue: q.to_string(),
            items: *n,
        })
        .collect()
}

pub(super) async fn promote(h: &dyn Harness, limit: u32) -> PromoteScheduledOutcome {
    h.coordinator()
        .promote_scheduled(PromoteScheduledParams { limit })
        .await
        .expect("promote")
}

pub(super) async fn dead_letter(h: &dyn Harness, limit: u32) -> DeadLetterExpiredOutcome {
    h.coordinator()
        .dead_letter_expired(DeadLetterExpiredParams { limit })
        .await
        .expect("dead-letter")
}

/// `prune_finished`'s items; the rotation of the history's partitions, the PostgreSQL store's
/// own (the fake has none), is left out (tested in crates/coordinator/tests/pg.rs).
pub(super) async fn prune(h: &dyn Harness, limit: u32) -> PruneFinishedOutcome {
    let out = h
        .coordinator()
        .prune_finished(PruneFinishedParams {
            completed_retention: DAY,
            dead_retention: 7 * DAY,
            limit,
        })
        .await
        .expect("prune");
    PruneFinishedOutcome {
        completed: out.completed,
        dead: out.dead,
        cancelled: out.cancelled,
        ..Default::default()
    }
}

/// Enqueues `n` items due in an hour.
pub(super) async fn enqueue_later(h: &dyn Harness, q: &str, n: usize) -> Vec<WorkId> {
    enqueue(
        h,
        (0..n)
            .map(|i| NewWork::new(q, json!({ "n": i })).run_after(HOUR))
            .collect(),
    )
    .await
}

/// Waits for the next wake signal, skipping `Connected`.
pub(super) async fn next_wake(listener: &mut Box<dyn crate::WakeListener>) -> String {
    let wait = async {
        loop {
            match listener.next_event().await.expect("listen") {
                ListenEvent::Wake { queue } => return queue,
                ListenEvent::Connected => continue,
                ListenEvent::Disconnected => panic!("the listener disconnected"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("a wake signal within 10 s")
}

pub(super) async fn cancel(h: &dyn Harness, id: WorkId) -> Result<CancelWorkOutcome> {
    h.operations().cancel_work(CancelWorkParams { id }).await
}

pub(super) async fn retry(h: &dyn Harness, id: WorkId) -> Result<RetryDeadWorkOutcome> {
    h.operations()
        .retry_dead_work(RetryDeadWorkParams { id })
        .await
}

pub(super) async fn discard(h: &dyn Harness, id: WorkId) -> Result<DiscardWorkOutcome> {
    h.operations().discard_work(DiscardWorkParams { id }).await
}

pub(super) fn assert_invalid_state(
    err: Error,
    want_id: WorkId,
    want_state: WorkState,
    reason_has: &str,
) {
    match &err {
        Error::InvalidState { id, state, reason } => {
            assert_eq!((*id, *state), (want_id, want_state), "{err}");
            assert!(reason.contains(reason_has), "{err}");
            assert!(!err.is_transient());
        }
        other => panic!("expected InvalidState for item {want_id}, got {other}"),
    }
}

pub(super) fn assert_not_found(err: Error, want_id: WorkId) {
    assert!(
        matches!(err, Error::NotFound { id } if id == want_id),
        "expected NotFound for item {want_id}, got {err}"
    );
}
