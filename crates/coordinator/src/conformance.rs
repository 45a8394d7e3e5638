//! The conformance suite: one set of cases that every [`WorkCoordinator`] must pass. The
//! coordinator crate runs it against [`crate::PgCoordinator`] on a real server and against
//! [`crate::FakeCoordinator`]; a change to the trait or to a SQL function extends it in the
//! same commit.
//!
//! A [`Harness`] gives a case the coordinator plus the few things a test needs that the trait
//! deliberately lacks: reading a row, and moving rows in time (as an `UPDATE` in the test
//! would) instead of injecting a clock. Use [`conformance_suite!`](crate::conformance_suite)
//! to turn every case into a test.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::types::*;
use crate::{Operations, WorkCoordinator};

/// A work item as the store holds it, for assertions.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkRow {
    /// The id.
    pub id: WorkId,
    /// The queue.
    pub queue: String,
    /// The state.
    pub state: WorkState,
    /// The priority.
    pub priority: i16,
    /// Attempts started.
    pub attempt: i32,
    /// Attempt limit.
    pub max_attempts: i32,
    /// The lease owner.
    pub instance: Option<InstanceId>,
    /// Whether a lease expiry is set.
    pub has_lease: bool,
    /// The latest claim's token.
    pub claim_token: Option<ClaimToken>,
    /// Renewals of the current claim.
    pub renewals: i32,
    /// An operator asked to cancel.
    pub cancel_requested: bool,
    /// The payload.
    pub payload: Value,
    /// The saved checkpoint.
    pub checkpoint: Option<Value>,
    /// The error history, oldest first.
    pub errors: Vec<ErrorEntry>,
    /// The unique key.
    pub unique_key: Option<String>,
    /// Whether `finished_at` is set.
    pub finished: bool,
}

/// One entry of an item's error history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorEntry {
    /// The attempt that failed.
    pub attempt: i64,
    /// `failed`, `rejected`, `cancelled`, `lease_expired`, `released`, or `retried` (a note
    /// that an operator retried the dead letter).
    pub kind: String,
    /// The message.
    pub error: String,
    /// The instance that held the attempt, when known.
    pub instance: Option<String>,
}

impl ErrorEntry {
    /// Reads an entry of the `errors` JSON array.
    pub fn from_json(v: &Value) -> Self {
        ErrorEntry {
            attempt: v["attempt"].as_i64().unwrap_or(-1),
            kind: v["kind"].as_str().unwrap_or_default().to_owned(),
            error: v["error"].as_str().unwrap_or_default().to_owned(),
            instance: v["instance"].as_str().map(str::to_owned),
        }
    }
}

/// What a case needs besides the coordinator.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The coordinator under test, on a fresh, migrated store.
    fn coordinator(&self) -> Arc<dyn WorkCoordinator>;
    /// The operator's calls on the same store. A [`WorkCoordinator`] implemented outside
    /// this crate (a decorator) returns those of the store it wraps: [`Operations`] is sealed.
    fn operations(&self) -> Arc<dyn Operations>;
    /// One work item as stored; `None` when it does not exist.
    async fn work_row(&self, id: WorkId) -> Option<WorkRow>;
    /// How many work items exist.
    async fn work_count(&self) -> usize;
    /// Sets a leased item's expiry to the store's now + `offset` (negative: in the past).
    async fn set_lease_expiry(&self, id: WorkId, offset: chrono::Duration);
    /// Sets an item's lease expiry to exactly the store's now, then claims, at one instant.
    async fn claim_with_lease_expiring_now(
        &self,
        id: WorkId,
        params: ClaimWorkParams,
    ) -> Result<ClaimWorkOutcome>;
    /// Moves an instance's last heartbeat `by` into the past.
    async fn age_heartbeat(&self, instance: InstanceId, by: Duration);
    /// Sets an item's cancel flag (an operator's cancel of a running item).
    async fn request_cancel(&self, id: WorkId);
    /// Whether the instance has a row.
    async fn instance_registered(&self, instance: InstanceId) -> bool;
    /// Ends the session that holds `instance`'s alive-lock, as a killed connection would.
    async fn kill_alive_lock_session(&self, instance: InstanceId);
    /// The instance's alive-lock key, where the store has one (PostgreSQL).
    async fn alive_lock_key(&self, instance: InstanceId) -> Option<i64>;
    /// Sets a scheduled item's run_at to the store's now + `offset` (negative: due).
    async fn set_run_at(&self, id: WorkId, offset: chrono::Duration);
    /// Moves a finished item's finished_at `by` into the past.
    async fn age_finished(&self, id: WorkId, by: Duration);
    /// Moves the eviction tombstone of a reaped instance `by` into the past.
    async fn age_eviction(&self, instance: InstanceId, by: Duration);
    /// Moves the first observation of an instance's lost alive-lock `by` into the past.
    async fn age_lock_loss(&self, instance: InstanceId, by: Duration);
    /// Moves back `by` the moment `instance`'s alive-lock session took its lock
    /// (`lock_since`): as if that session, and so the instance's watch of the store, were
    /// older.
    async fn age_watch(&self, instance: InstanceId, by: Duration);
    /// Moves back `by` the last sighting of `instance`'s lock held by its own session
    /// (`lock_seen_at`), as if its last heartbeat were that much older.
    async fn age_lock_sighting(&self, instance: InstanceId, by: Duration);
    /// Ends every session of the store, as a PostgreSQL restart, crash or failover does: the
    /// alive-lock sessions, the listeners and every pooled connection.
    async fn restart(&self);
    /// Where [`judge`] keeps the harness's seasoned judge.
    fn judge_slot(&self) -> &JudgeSlot;
}

/// The harness's judge: an instance that holds its alive-lock and has watched the store for
/// longer than any cutoff the cases use, so that its sweeps may apply every rule. Kept for
/// the harness's life (its lock session with it).
#[derive(Default)]
pub struct JudgeSlot(tokio::sync::Mutex<Option<(InstanceId, Box<dyn crate::AliveLockSession>)>>);

impl std::fmt::Debug for JudgeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeSlot").finish_non_exhaustive()
    }
}

/// Generates one `#[tokio::test]` per conformance case. `$make` is an async fn returning
/// something that derefs to a [`Harness`].
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@cases $make;
            orphan_predicate_truth_table,
            concurrent_claimers_receive_each_row_exactly_once,
            claim_honours_max_items_and_the_queue_filter,
            claim_orders_by_priority_then_age,
            claim_waits_for_run_at_in_the_future,
            claim_refuses_an_unknown_queue_naming_the_first_and_an_unregistered_instance,
            an_orphan_claim_bumps_the_attempt_and_mints_a_new_token,
            an_orphan_with_attempts_used_up_becomes_a_dead_letter,
            the_drain_hint_says_whether_more_were_left,
            renewal_extends_only_leases_fenced_to_the_caller,
            renewal_of_a_finished_or_reclaimed_item_reports_lost,
            renewal_reports_a_cancel_request,
            renewal_of_an_empty_list_returns_nothing_and_bad_arguments_are_refused,
            heartbeat_inserts_then_updates,
            heartbeat_sweeps_only_when_a_peer_is_stale_and_never_reaps_the_caller,
            heartbeat_from_an_evicted_instance_reports_eviction_and_writes_nothing,
            cleanup_releases_every_lease_of_the_instances_it_deletes,
            cleanup_keeps_a_stale_instance_whose_alive_lock_is_held,
            cleanup_deletes_past_the_definitive_dead_cutoff_even_with_the_lock_held,
            a_lock_proven_instance_whose_lock_stays_gone_past_the_grace_is_reaped_and_its_queues_woken,
            a_lock_taken_again_within_the_grace_keeps_the_instance,
            an_instance_that_never_held_its_lock_is_judged_by_staleness_alone,
            a_heartbeat_sweeps_when_a_lock_proven_peer_loses_its_lock,
            a_restart_evicts_nobody_and_a_peer_that_never_comes_back_goes_by_staleness,
            a_lock_blip_at_any_heartbeat_age_is_covered_by_the_grace,
            the_liveness_check_credits_only_the_instances_own_lock_session,
            a_sweep_never_reaps_its_caller,
            a_judge_that_sees_a_peers_lock_held_can_fail_it_over_in_seconds,
            a_judge_reaps_by_staleness_only_after_watching_for_longer_than_the_cutoff,
            a_peer_is_judged_by_the_cutoffs_it_declared,
            liveness_cutoffs_below_the_store_floor_are_refused,
            server_status_reports_the_notification_queue_usage,
            maintenance_due_flags_exactly_the_steps_that_have_work,
            alive_lock_keys_that_hash_to_negative_values_work,
            killing_the_alive_lock_session_releases_the_lock,
            the_alive_lock_is_taken_once_per_session,
            a_zombies_outcomes_after_a_reclaim_are_fenced_out,
            complete_records_success_once,
            failure_with_retry_schedules_the_item_and_keeps_the_error,
            failure_at_max_attempts_dead_letters_with_the_full_history,
            rejection_and_cancellation_finish_the_item,
            a_drained_release_does_not_consume_an_attempt,
            a_release_that_consumes_the_last_attempt_dead_letters,
            a_checkpoint_reaches_the_next_attempt,
            bulk_enqueue_of_ten_thousand_items_in_one_call,
            enqueue_refuses_unknown_queues_oversized_batches_and_invalid_payloads_and_writes_nothing,
            a_unique_key_returns_the_existing_item_while_it_is_unfinished,
            scheduled_items_are_scheduled_and_priorities_kept,
            deregistering_releases_leases_and_deletes_the_instance,
            promotion_moves_only_due_scheduled_items_and_wakes_their_claimers,
            promotion_takes_at_most_limit_items_oldest_first,
            concurrent_sweeps_promote_each_due_item_exactly_once,
            expired_leases_with_attempts_used_up_become_dead_letters_in_every_queue,
            expired_leases_of_cancelled_items_end_cancelled_and_the_limit_holds,
            pruning_deletes_only_finished_items_past_their_retention,
            pruning_takes_completed_items_first_and_at_most_limit,
            pruning_tombstones_forgets_only_old_evictions,
            queue_depth_counts_waiting_and_running_items_per_queue,
            cancel_of_a_waiting_item_cancels_it_at_once,
            cancel_of_a_running_item_is_requested_and_reaches_its_owner,
            cancel_of_a_finished_or_unknown_item_is_refused,
            a_retried_dead_letter_is_claimable_again_with_fresh_attempts_and_its_history,
            retry_refuses_items_that_are_not_dead_letters_or_whose_unique_key_is_taken,
            discard_deletes_finished_items_and_refuses_unfinished_ones,
            maintenance_calls_refuse_bad_limits_and_retentions,
            renewal_by_an_evicted_instance_answers_evicted_for_every_lease,
            a_repeated_pair_is_answered_once_and_its_first_disposition_wins,
            a_cancel_requested_item_that_fails_or_is_released_ends_cancelled_and_says_why,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make().await;
                $crate::conformance::$case(&*harness).await;
            }
        )*
    };
}

const LEASE: Duration = Duration::from_secs(60);
const STALE: Duration = Duration::from_secs(30);
const DEAD: Duration = Duration::from_secs(300);
const GRACE: Duration = Duration::from_secs(3);

// -- helpers ----------------------------------------------------------------------------------

async fn queue(h: &dyn Harness, name: &str, max_attempts: i32) {
    h.coordinator()
        .register_queue(RegisterQueueParams {
            name: name.into(),
            max_attempts,
        })
        .await
        .expect("register queue");
}

async fn instance(h: &dyn Harness) -> InstanceId {
    let id = InstanceId::new();
    heartbeat(h, id).await;
    id
}

/// A registration beat with the shipped cutoffs that says nothing about the lock.
async fn heartbeat(h: &dyn Harness, id: InstanceId) -> RecordHeartbeatOutcome {
    beat(h, id, AliveLockReport::Unreported, true).await
}

async fn beat(
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

fn beat_params(
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
async fn take_lock(h: &dyn Harness, id: InstanceId) -> TakeAliveLockOutcome {
    let lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: id })
        .await
        .expect("take the alive-lock");
    assert!(lock.held, "the alive-lock of {id} is free");
    lock
}

/// The harness's judge (see [`JudgeSlot`]): registered, holding its lock, and watching the
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

async fn enqueue(h: &dyn Harness, items: Vec<NewWork>) -> Vec<WorkId> {
    h.coordinator()
        .enqueue_work(EnqueueWorkParams { items })
        .await
        .expect("enqueue")
        .items
        .into_iter()
        .map(|e| e.id)
        .collect()
}

async fn enqueue_n(h: &dyn Harness, q: &str, n: usize) -> Vec<WorkId> {
    enqueue(
        h,
        (0..n).map(|i| NewWork::new(q, json!({ "n": i }))).collect(),
    )
    .await
}

fn claim_params(instance: InstanceId, queues: &[&str], max_items: u32) -> ClaimWorkParams {
    ClaimWorkParams {
        instance,
        queues: queues.iter().map(|q| q.to_string()).collect(),
        max_items,
        lease: LEASE,
    }
}

async fn claim(
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

fn ids(outcome: &ClaimWorkOutcome) -> HashSet<WorkId> {
    outcome.items.iter().map(|c| c.fence.id).collect()
}

async fn row(h: &dyn Harness, id: WorkId) -> WorkRow {
    h.work_row(id).await.expect("row exists")
}

async fn renew(h: &dyn Harness, instance: InstanceId, leases: Vec<Fence>) -> Vec<Renewal> {
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

async fn complete(h: &dyn Harness, instance: InstanceId, items: Vec<Fence>) -> OutcomeBatch {
    h.coordinator()
        .complete_work(CompleteWorkParams { instance, items })
        .await
        .expect("complete")
}

async fn fail(
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

/// A sweep by the harness's judge, without the lock-lost rule.
async fn cleanup(h: &dyn Harness, dead_after: Option<Duration>) -> CleanupStaleInstancesOutcome {
    let judge = judge(h).await;
    sweep_by(h, Some(judge), dead_after, None).await
}

async fn sweep_by(
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
async fn claim_one(h: &dyn Harness, instance: InstanceId, q: &str) -> ClaimedWork {
    let out = claim(h, instance, &[q], 1).await;
    assert_eq!(out.items.len(), 1, "expected one claimed item");
    out.items.into_iter().next().expect("one item")
}

// -- claim_work -------------------------------------------------------------------------------

/// The orphan predicate as a truth table, through claim_work: unowned (released) and
/// expired leases are claimable; an expiry of exactly now, a future expiry and a finished
/// item are not.
pub async fn orphan_predicate_truth_table(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    let unowned = enqueue_n(h, "q", 1).await[0];
    claim_one(h, a, "q").await;
    let four = enqueue_n(h, "q", 4).await;
    let (past, exact, future, finished) = (four[0], four[1], four[2], four[3]);
    let held = claim(h, b, &["q"], 4).await;
    assert_eq!(ids(&held), four.iter().copied().collect());
    // `a` is reaped: its lease is released (owner and expiry NULL).
    h.age_heartbeat(a, STALE * 2).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
    h.set_lease_expiry(past, chrono::Duration::seconds(-1))
        .await;
    h.set_lease_expiry(future, chrono::Duration::seconds(30))
        .await;
    let done = held
        .items
        .iter()
        .find(|c| c.fence.id == finished)
        .expect("claimed")
        .fence;
    complete(h, b, vec![done]).await;

    let c = instance(h).await;
    let out = h
        .claim_with_lease_expiring_now(exact, claim_params(c, &["q"], 10))
        .await
        .expect("claim");
    let got = ids(&out);
    assert!(got.contains(&unowned), "unowned (released): claimable");
    assert!(got.contains(&past), "owned, expiry in the past: claimable");
    assert!(!got.contains(&exact), "expiry exactly now: not claimable");
    assert!(
        !got.contains(&future),
        "expiry in the future: not claimable"
    );
    assert!(!got.contains(&finished), "finished: not claimable");
    assert_eq!(got.len(), 2);
    assert!(out.items.iter().all(|i| i.reclaimed && i.attempt == 2));
}

/// Concurrent claimers never receive the same row; together they receive each exactly once.
pub async fn concurrent_claimers_receive_each_row_exactly_once(h: &dyn Harness) {
    queue(h, "q", 10).await;
    const ROWS: usize = 3000;
    const CLAIMERS: usize = 8;
    let ids: HashSet<WorkId> = enqueue_n(h, "q", ROWS).await.into_iter().collect();
    let mut tasks = Vec::new();
    for _ in 0..CLAIMERS {
        let me = instance(h).await;
        let c = h.coordinator();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let out = c
                    .claim_work(claim_params(me, &["q"], 50))
                    .await
                    .expect("claim");
                if out.items.is_empty() {
                    break;
                }
                mine.extend(out.items.iter().map(|i| i.fence.id));
            }
            mine
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tasks {
        for id in t.await.expect("claimer") {
            total += 1;
            assert!(seen.insert(id), "item {id} was claimed twice");
        }
    }
    assert_eq!(total, ROWS);
    assert_eq!(seen, ids);
}

/// Claim honours max_items and the queue filter.
pub async fn claim_honours_max_items_and_the_queue_filter(h: &dyn Harness) {
    queue(h, "a", 10).await;
    queue(h, "b", 10).await;
    let me = instance(h).await;
    let in_a: HashSet<_> = enqueue_n(h, "a", 5).await.into_iter().collect();
    let in_b: HashSet<_> = enqueue_n(h, "b", 5).await.into_iter().collect();
    let first = claim(h, me, &["a"], 3).await;
    assert_eq!(first.items.len(), 3);
    assert!(ids(&first).is_subset(&in_a));
    assert!(first.items.iter().all(|c| c.queue == "a" && c.attempt == 1));
    let rest = claim(h, me, &["a"], 100).await;
    assert_eq!(rest.items.len(), 2);
    assert!(ids(&rest).is_subset(&in_a));
    assert!(claim(h, me, &["a"], 100).await.items.is_empty());
    let both = claim(h, me, &["a", "b"], 100).await;
    assert_eq!(ids(&both), in_b);
}

/// Priority first (lower runs first), then age.
pub async fn claim_orders_by_priority_then_age(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(0)).priority(5),
            NewWork::new("q", json!(1)).priority(1),
            NewWork::new("q", json!(2)).priority(5),
            NewWork::new("q", json!(3)).priority(-3),
            NewWork::new("q", json!(4)).priority(1),
        ],
    )
    .await;
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(claim_one(h, me, "q").await.fence.id);
    }
    assert_eq!(order, vec![ids[3], ids[1], ids[4], ids[0], ids[2]]);
}

/// An item whose run_at is in the future is not claimed until it is due.
pub async fn claim_waits_for_run_at_in_the_future(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let later = enqueue(
        h,
        vec![NewWork::new("q", json!(1)).run_after(Duration::from_secs(3600))],
    )
    .await[0];
    assert_eq!(row(h, later).await.state, WorkState::Scheduled);
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());
    let past = enqueue(
        h,
        vec![NewWork::new("q", json!(2)).run_at(chrono::Utc::now() - chrono::Duration::hours(1))],
    )
    .await[0];
    assert_eq!(row(h, past).await.state, WorkState::Available);
    assert_eq!(ids(&claim(h, me, &["q"], 10).await), HashSet::from([past]));
}

/// A claim that names a queue nobody registered is refused naming the first such queue, as
/// an enqueue is, and claims nothing, not even from the known queues it names; an
/// unregistered instance is refused. (A paused queue yields nothing: PostgreSQL-only, the
/// trait cannot pause.)
pub async fn claim_refuses_an_unknown_queue_naming_the_first_and_an_unregistered_instance(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let err = h
        .coordinator()
        .claim_work(claim_params(me, &["q", "nope", "nada"], 10))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "nope"),
        "{err}"
    );
    assert!(!err.is_transient());
    assert_eq!(
        row(h, id).await.state,
        WorkState::Available,
        "nothing claimed"
    );
    assert_eq!(ids(&claim(h, me, &["q"], 10).await), HashSet::from([id]));
    let stranger = InstanceId::new();
    let err = h
        .coordinator()
        .claim_work(claim_params(stranger, &["q"], 10))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NotRegistered(i) if i == stranger),
        "{err}"
    );
    assert!(!h.instance_registered(stranger).await);
    let err = h
        .coordinator()
        .claim_work(claim_params(me, &["q"], 0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

/// Reclaiming an expired lease counts an attempt and mints a new token.
pub async fn an_orphan_claim_bumps_the_attempt_and_mints_a_new_token(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let first = claim_one(h, a, "q").await;
    assert_eq!((first.attempt, first.reclaimed), (1, false));
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    let second = claim_one(h, b, "q").await;
    assert_eq!(second.fence.id, id);
    assert_eq!(second.attempt, 2);
    assert!(second.reclaimed);
    assert_ne!(second.fence.token, first.fence.token);
    let r = row(h, id).await;
    assert_eq!(r.instance, Some(b));
    assert_eq!(r.claim_token, Some(second.fence.token));
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].kind, "lease_expired");
    assert_eq!(r.errors[0].attempt, 1);
}

/// An orphan with no attempts left becomes a dead letter instead of a claim.
pub async fn an_orphan_with_attempts_used_up_becomes_a_dead_letter(h: &dyn Harness) {
    queue(h, "q", 1).await;
    let a = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    claim_one(h, a, "q").await;
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    assert!(claim(h, a, &["q"], 10).await.items.is_empty());
    let r = row(h, id).await;
    assert_eq!(r.state, WorkState::Dead);
    assert!(r.finished && r.instance.is_none() && !r.has_lease);
    assert_eq!(
        r.errors.last().map(|e| e.kind.as_str()),
        Some("lease_expired")
    );
}

/// The drain hint is true exactly when claimable rows were left after filling the batch.
pub async fn the_drain_hint_says_whether_more_were_left(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 5).await;
    let first = claim(h, me, &["q"], 3).await;
    assert_eq!(first.items.len(), 3);
    assert!(first.has_more, "two were left");
    let exact = claim(h, me, &["q"], 2).await;
    assert_eq!(exact.items.len(), 2);
    assert!(!exact.has_more, "none were left after an exact fit");
    let empty = claim(h, me, &["q"], 2).await;
    assert!(empty.items.is_empty() && !empty.has_more);
}

// -- renew_leases -----------------------------------------------------------------------------

/// Renewal extends only rows fenced to the caller's instance and token.
pub async fn renewal_extends_only_leases_fenced_to_the_caller(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    enqueue_n(h, "q", 1).await;
    let item = claim_one(h, a, "q").await;
    let f = item.fence;
    let forged = Fence {
        id: f.id,
        token: f.token + 1_000_000,
    };
    let replies = renew(h, a, vec![f, forged]).await;
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].fence, f);
    assert_eq!(replies[0].status, RenewalStatus::Renewed);
    assert_eq!(replies[1].fence, forged);
    assert_eq!(replies[1].status, RenewalStatus::Lost);
    let by_peer = renew(h, b, vec![f]).await;
    assert_eq!(by_peer[0].status, RenewalStatus::Lost);
    let r = row(h, f.id).await;
    assert_eq!((r.renewals, r.instance), (1, Some(a)));
}

/// A finished or reclaimed item's renewal reports lost and changes nothing.
pub async fn renewal_of_a_finished_or_reclaimed_item_reports_lost(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let done = claim_one(h, a, "q").await.fence;
    let taken = claim_one(h, a, "q").await.fence;
    complete(h, a, vec![done]).await;
    h.set_lease_expiry(taken.id, chrono::Duration::seconds(-1))
        .await;
    let reclaimed = claim_one(h, b, "q").await;
    assert_eq!(reclaimed.fence.id, taken.id);
    let replies = renew(h, a, vec![done, taken]).await;
    assert!(replies.iter().all(|r| r.status == RenewalStatus::Lost));
    assert_eq!(row(h, done.id).await.state, WorkState::Completed);
    assert_eq!(row(h, taken.id).await.instance, Some(b));
}

/// A cancel request travels back in the renewal reply.
pub async fn renewal_reports_a_cancel_request(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let one = claim_one(h, a, "q").await.fence;
    let two = claim_one(h, a, "q").await.fence;
    h.request_cancel(two.id).await;
    let replies = renew(h, a, vec![one, two]).await;
    assert!(!replies[0].cancel_requested);
    assert!(replies[1].cancel_requested);
    assert_eq!(replies[1].status, RenewalStatus::Renewed);
}

/// Nothing in, nothing out; a bad lease is refused with a message naming it.
pub async fn renewal_of_an_empty_list_returns_nothing_and_bad_arguments_are_refused(
    h: &dyn Harness,
) {
    let a = instance(h).await;
    assert!(renew(h, a, vec![]).await.is_empty());
    let err = h
        .coordinator()
        .renew_leases(RenewLeasesParams {
            instance: a,
            leases: vec![Fence { id: 1, token: 1 }],
            lease: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("lease")),
        "{err}"
    );
}

// -- record_heartbeat / cleanup_stale_instances -------------------------------------------------

/// The first heartbeat inserts the instance, later ones update it.
pub async fn heartbeat_inserts_then_updates(h: &dyn Harness) {
    let me = InstanceId::new();
    assert!(!h.instance_registered(me).await);
    let first = heartbeat(h, me).await;
    assert_eq!(first, RecordHeartbeatOutcome::default());
    assert!(h.instance_registered(me).await);
    h.age_heartbeat(me, STALE * 2).await;
    heartbeat(h, me).await;
    // Fresh again: a sweep by a peer does not reap it.
    let peer = instance(h).await;
    let _ = peer;
    assert!(cleanup(h, Some(DEAD)).await.reaped.is_empty());
    assert!(h.instance_registered(me).await);
}

/// The sweep runs only when some peer is stale, and never reaps the caller.
pub async fn heartbeat_sweeps_only_when_a_peer_is_stale_and_never_reaps_the_caller(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    // `me` judges in its own beats: it holds its lock and has watched long enough.
    let _me_lock = take_lock(h, me).await;
    h.age_watch(me, DEAD * 2).await;
    let peer = instance(h).await;
    enqueue_n(h, "q", 3).await;
    claim(h, peer, &["q"], 3).await;
    let quiet = heartbeat(h, me).await;
    assert_eq!((quiet.reaped, quiet.released), (0, 0));
    // Both stale; only the peer goes.
    h.age_heartbeat(me, STALE * 2).await;
    h.age_heartbeat(peer, STALE * 2).await;
    let swept = heartbeat(h, me).await;
    assert_eq!((swept.evicted, swept.reaped, swept.released), (false, 1, 3));
    assert!(h.instance_registered(me).await);
    assert!(!h.instance_registered(peer).await);
}

/// A reaped instance's heartbeat reports eviction and does not resurrect it.
pub async fn heartbeat_from_an_evicted_instance_reports_eviction_and_writes_nothing(
    h: &dyn Harness,
) {
    let gone = instance(h).await;
    let _peer = instance(h).await;
    h.age_heartbeat(gone, STALE * 2).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
    let late = heartbeat(h, gone).await;
    assert!(late.evicted);
    assert!(!h.instance_registered(gone).await);
    // Without a tombstone too: a beat that is not the instance's first finds no row only
    // because the instance was reaped (and its tombstone pruned since).
    let stranger = InstanceId::new();
    assert!(
        beat(h, stranger, AliveLockReport::Unreported, false)
            .await
            .evicted
    );
    assert!(!h.instance_registered(stranger).await);
    let err = h
        .coordinator()
        .claim_work(claim_params(gone, &["q"], 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotRegistered(_)), "{err}");
}

/// Cleanup releases all leases of the instances it deletes at once.
pub async fn cleanup_releases_every_lease_of_the_instances_it_deletes(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let dead = instance(h).await;
    let live = instance(h).await;
    enqueue_n(h, "q", 6).await;
    let dead_items = claim(h, dead, &["q"], 4).await;
    let live_items = claim(h, live, &["q"], 2).await;
    h.age_heartbeat(dead, STALE * 2).await;
    let out = cleanup(h, Some(DEAD)).await;
    assert_eq!(
        out.reaped,
        vec![ReapedInstance {
            instance: dead,
            released: 4
        }]
    );
    for c in &dead_items.items {
        let r = row(h, c.fence.id).await;
        assert_eq!(
            (r.state, r.instance, r.has_lease),
            (WorkState::Running, None, false)
        );
    }
    for c in &live_items.items {
        assert_eq!(row(h, c.fence.id).await.instance, Some(live));
    }
    // The released leases are claimable at once, with the next attempt.
    let taken = claim(h, live, &["q"], 10).await;
    assert_eq!(ids(&taken), ids(&dead_items));
    assert!(taken.items.iter().all(|c| c.attempt == 2 && c.reclaimed));
}

/// The alive-lock guard: a stale instance whose lock is held by a live session stays.
pub async fn cleanup_keeps_a_stale_instance_whose_alive_lock_is_held(h: &dyn Harness) {
    let slow = instance(h).await;
    let lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: slow })
        .await
        .expect("take lock");
    assert!(lock.held);
    h.age_heartbeat(slow, STALE * 2).await;
    assert!(cleanup(h, Some(DEAD)).await.reaped.is_empty());
    assert!(cleanup(h, None).await.reaped.is_empty());
    assert!(h.instance_registered(slow).await);
    drop(lock);
    wait_until_not_alive(h, slow).await;
    // It relied on its lock: the lock's absence must have been seen before it counts.
    assert!(
        cleanup(h, Some(DEAD)).await.reaped.is_empty(),
        "first sight"
    );
    h.age_lock_loss(slow, Duration::from_secs(1)).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
}

/// The definitive-dead bypass: past the dead cutoff the lock does not save an instance.
pub async fn cleanup_deletes_past_the_definitive_dead_cutoff_even_with_the_lock_held(
    h: &dyn Harness,
) {
    let zombie = instance(h).await;
    let _lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: zombie })
        .await
        .expect("take lock");
    h.age_heartbeat(zombie, DEAD + Duration::from_secs(1)).await;
    let out = cleanup(h, Some(DEAD)).await;
    assert_eq!(out.reaped.len(), 1);
    assert_eq!(out.reaped[0].instance, zombie);
}

/// A sweep by the harness's judge with every rule.
async fn sweep_with_grace(h: &dyn Harness) -> CleanupStaleInstancesOutcome {
    let judge = judge(h).await;
    sweep_by(h, Some(judge), Some(DEAD), Some(GRACE)).await
}

/// Failover in seconds: a dead process loses its lock at once; one sweep sees it gone, the
/// first sweep after the grace reaps it, releases its leases and wakes the claimers.
pub async fn a_lock_proven_instance_whose_lock_stays_gone_past_the_grace_is_reaped_and_its_queues_woken(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let dead = instance(h).await;
    let lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: dead })
        .await
        .expect("lock");
    assert!(lock.held);
    enqueue_n(h, "q", 3).await;
    let held = claim(h, dead, &["q"], 3).await;
    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("event"),
        ListenEvent::Connected
    );
    // Its heartbeat is fresh: only the lock tells.
    h.kill_alive_lock_session(dead).await;
    wait_until_not_alive(h, dead).await;
    assert!(
        sweep_with_grace(h).await.reaped.is_empty(),
        "first sight: within the grace"
    );
    assert!(h.instance_registered(dead).await);
    h.age_lock_loss(dead, GRACE + Duration::from_secs(1)).await;
    let out = sweep_with_grace(h).await;
    assert_eq!(
        out.reaped,
        vec![ReapedInstance {
            instance: dead,
            released: 3
        }]
    );
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("a wake signal in time")
        .expect("event");
    assert_eq!(woken, ListenEvent::Wake { queue: "q".into() });
    let peer = instance(h).await;
    let taken = claim(h, peer, &["q"], 10).await;
    assert_eq!(ids(&taken), ids(&held));
    assert!(heartbeat(h, dead).await.evicted);
    drop(lock);
}

/// A lock connection that blips is taken again within the grace: nothing happens.
pub async fn a_lock_taken_again_within_the_grace_keeps_the_instance(h: &dyn Harness) {
    let me = instance(h).await;
    let first = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("lock");
    h.kill_alive_lock_session(me).await;
    wait_until_not_alive(h, me).await;
    assert!(sweep_with_grace(h).await.reaped.is_empty());
    drop(first);
    let again = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("lock again");
    assert!(again.held);
    h.age_lock_loss(me, GRACE * 10).await;
    assert!(sweep_with_grace(h).await.reaped.is_empty());
    assert!(h.instance_registered(me).await);
}

/// Without ever holding its lock (heartbeat-table-only liveness, or no connection to spare)
/// an instance is judged by staleness alone, lock grace or not.
pub async fn an_instance_that_never_held_its_lock_is_judged_by_staleness_alone(h: &dyn Harness) {
    let tableonly = instance(h).await;
    h.age_lock_loss(tableonly, GRACE * 10).await;
    assert!(sweep_with_grace(h).await.reaped.is_empty());
    h.age_heartbeat(tableonly, STALE * 2).await;
    assert_eq!(sweep_with_grace(h).await.reaped.len(), 1);
}

/// record_heartbeat's opportunistic sweep also looks for lock-proven peers without a lock.
pub async fn a_heartbeat_sweeps_when_a_lock_proven_peer_loses_its_lock(h: &dyn Harness) {
    let dead = instance(h).await;
    let _lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: dead })
        .await
        .expect("lock");
    let me = instance(h).await;
    let _me_lock = take_lock(h, me).await;
    h.age_watch(me, DEAD * 2).await;
    h.kill_alive_lock_session(dead).await;
    wait_until_not_alive(h, dead).await;
    let params = || beat_params(me, AliveLockReport::Unreported, false);
    let first = h
        .coordinator()
        .record_heartbeat(params())
        .await
        .expect("beat");
    assert_eq!(first.reaped, 0, "first sight");
    h.age_lock_loss(dead, GRACE * 2).await;
    let second = h
        .coordinator()
        .record_heartbeat(params())
        .await
        .expect("beat");
    assert_eq!(second.reaped, 1);
    assert!(!h.instance_registered(dead).await);
}

/// A restart (crash, failover) ends every session at once: every lock goes, the judge's
/// included. None of that is evidence that a client died: nobody is reaped, whatever the
/// beat ages — past the definitive-dead cutoff too (an outage longer than it) — however long
/// the locks stay away. A peer that never comes back goes by staleness once a judge has
/// watched the new server for longer than the stale cutoff.
pub async fn a_restart_evicts_nobody_and_a_peer_that_never_comes_back_goes_by_staleness(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let judge = instance(h).await;
    let judge_lock = take_lock(h, judge).await;
    h.age_watch(judge, DEAD * 2).await;
    let fresh = instance(h).await;
    let mid = instance(h).await;
    let late = instance(h).await;
    let outlasted = instance(h).await;
    let gone = instance(h).await;
    let mut locks = Vec::new();
    for id in [fresh, mid, late, outlasted, gone] {
        locks.push(take_lock(h, id).await);
    }
    enqueue_n(h, "q", 5).await;
    for id in [fresh, mid, late, outlasted, gone] {
        claim_one(h, id, "q").await;
    }
    // At the slow cadence (60 s) a lock holder's beat is often older than the stale cutoff;
    // an outage longer than the definitive-dead cutoff leaves every beat older than that.
    h.age_heartbeat(mid, Duration::from_secs(35)).await;
    h.age_heartbeat(late, Duration::from_secs(55)).await;
    h.age_heartbeat(outlasted, DEAD + Duration::from_secs(15))
        .await;
    h.age_heartbeat(gone, Duration::from_secs(55)).await;

    h.restart().await;
    drop(locks);
    drop(judge_lock);
    for id in [judge, fresh, mid, late, outlasted, gone] {
        wait_until_not_alive(h, id).await;
    }
    assert!(
        sweep_by(h, Some(judge), Some(DEAD), Some(GRACE))
            .await
            .reaped
            .is_empty(),
        "the first sweep after the restart"
    );
    for id in [fresh, mid, late, gone] {
        h.age_lock_loss(id, GRACE * 10).await;
    }
    assert!(
        sweep_by(h, Some(judge), Some(DEAD), Some(GRACE))
            .await
            .reaped
            .is_empty(),
        "locks gone for longer than the grace, but since before the judge's watch began"
    );
    assert!(
        sweep_by(h, None, Some(DEAD), Some(GRACE))
            .await
            .reaped
            .is_empty(),
        "an operator's sweep on a new connection"
    );

    // The living come back: each beats at once, then takes its lock again; so does the judge.
    let mut back = Vec::new();
    for id in [fresh, mid, late, outlasted] {
        assert!(!beat(h, id, AliveLockReport::NotHeld, false).await.evicted);
        back.push(take_lock(h, id).await);
    }
    let _judge_lock = take_lock(h, judge).await;
    assert!(sweep_by(h, Some(judge), Some(DEAD), Some(GRACE))
        .await
        .reaped
        .is_empty());
    // Once the judge has watched the new server for longer than the stale cutoff, the peer
    // that never came back goes — and only it.
    h.age_watch(judge, STALE * 2).await;
    let out = sweep_by(h, Some(judge), Some(DEAD), Some(GRACE)).await;
    assert_eq!(
        out.reaped,
        vec![ReapedInstance {
            instance: gone,
            released: 1
        }]
    );
    for id in [judge, fresh, mid, late, outlasted] {
        assert!(h.instance_registered(id).await);
    }
}

/// The lock session of a live instance is killed at any heartbeat age (at the slow cadence a
/// beat may be 55 s old, past the 30 s stale cutoff): the first sweep does not reap it (the
/// grace), and once the owner has beaten at once, saying it holds no lock, it is judged by
/// that beat, however long its lock stays away.
pub async fn a_lock_blip_at_any_heartbeat_age_is_covered_by_the_grace(h: &dyn Harness) {
    judge(h).await;
    for age in [0, 20, 35, 55] {
        let me = instance(h).await;
        let lock = take_lock(h, me).await;
        h.age_heartbeat(me, Duration::from_secs(age)).await;
        h.kill_alive_lock_session(me).await;
        drop(lock);
        wait_until_not_alive(h, me).await;
        assert!(
            sweep_with_grace(h).await.reaped.is_empty(),
            "first sight of the lost lock at beat age {age} s"
        );
        assert!(!beat(h, me, AliveLockReport::NotHeld, false).await.evicted);
        h.age_lock_loss(me, GRACE * 10).await;
        assert!(
            sweep_with_grace(h).await.reaped.is_empty(),
            "lock away past the grace after a beat, beat age {age} s"
        );
        let again = take_lock(h, me).await;
        assert!(sweep_with_grace(h).await.reaped.is_empty());
        assert!(h.instance_registered(me).await, "beat age {age} s");
        drop(again);
        h.coordinator()
            .deregister_instance(DeregisterInstanceParams { instance: me })
            .await
            .expect("deregister");
    }
}

/// Only the instance's own session proves it alive: a beat naming a session that does not
/// hold the lock (the lock is held by a former, half-open session) is not credited, so when
/// that former session ends the instance is not reaped as a lock holder. A beat naming the
/// session that holds the lock is credited.
pub async fn the_liveness_check_credits_only_the_instances_own_lock_session(h: &dyn Harness) {
    judge(h).await;
    let me = instance(h).await;
    let former = take_lock(h, me).await;
    let mut current = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("open a second session");
    assert!(!current.held, "the former session holds the lock");
    let current_id = current.session.session_id().expect("a session id");
    beat(h, me, AliveLockReport::Session(current_id), false).await;
    h.kill_alive_lock_session(me).await;
    drop(former);
    wait_until_not_alive(h, me).await;
    assert!(sweep_with_grace(h).await.reaped.is_empty());
    h.age_lock_loss(me, GRACE * 10).await;
    assert!(
        sweep_with_grace(h).await.reaped.is_empty(),
        "the lock of a former session is not the instance's"
    );
    assert!(h.instance_registered(me).await);

    // Now its own session holds the lock and a beat says so: it relies on it.
    assert!(current.session.retake().await.expect("retake"));
    beat(h, me, AliveLockReport::Session(current_id), false).await;
    h.kill_alive_lock_session(me).await;
    drop(current);
    wait_until_not_alive(h, me).await;
    assert!(sweep_with_grace(h).await.reaped.is_empty(), "first sight");
    h.age_lock_loss(me, GRACE + Duration::from_secs(1)).await;
    let out = sweep_with_grace(h).await;
    assert_eq!(out.reaped.len(), 1);
    assert_eq!(out.reaped[0].instance, me);
}

/// A sweep never reaps the instance that runs it (a lone instance whose own row went stale
/// during a partition must not evict itself when it heals); another judge does.
pub async fn a_sweep_never_reaps_its_caller(h: &dyn Harness) {
    let me = instance(h).await;
    let _lock = take_lock(h, me).await;
    h.age_watch(me, DEAD * 4).await;
    h.age_heartbeat(me, DEAD * 2).await;
    assert!(sweep_by(h, Some(me), Some(DEAD), Some(GRACE))
        .await
        .reaped
        .is_empty());
    assert!(h.instance_registered(me).await);
    let out = sweep_with_grace(h).await;
    assert_eq!(out.reaped.len(), 1, "past the definitive-dead cutoff");
    assert_eq!(out.reaped[0].instance, me);
}

/// A judge whose watch began after a peer's lock was last seen held (the judge restarted
/// since the peer's last heartbeat) cannot tell a lost lock from a server reset — unless it
/// has itself seen the lock held since: its sweeps record that sighting, and then the peer's
/// death is failover in seconds again.
pub async fn a_judge_that_sees_a_peers_lock_held_can_fail_it_over_in_seconds(h: &dyn Harness) {
    judge(h).await;
    let unseen = instance(h).await;
    let seen = instance(h).await;
    let mut locks = Vec::new();
    for id in [unseen, seen] {
        locks.push(take_lock(h, id).await);
        h.age_lock_sighting(id, DEAD * 4).await;
    }
    // A sweep while both locks are held sees both; `unseen`'s sighting is then moved back
    // again, as if the judge had never seen its lock held.
    assert!(sweep_with_grace(h).await.reaped.is_empty());
    h.age_lock_sighting(unseen, DEAD * 4).await;
    for id in [unseen, seen] {
        h.kill_alive_lock_session(id).await;
    }
    drop(locks);
    for id in [unseen, seen] {
        wait_until_not_alive(h, id).await;
    }
    assert!(sweep_with_grace(h).await.reaped.is_empty(), "first sight");
    for id in [unseen, seen] {
        h.age_lock_loss(id, GRACE * 2).await;
    }
    let out = sweep_with_grace(h).await;
    assert_eq!(
        out.reaped.iter().map(|r| r.instance).collect::<Vec<_>>(),
        vec![seen],
        "only the lock seen held within the judge's watch counts"
    );
    assert!(
        h.instance_registered(unseen).await,
        "left to the stale rule"
    );
}

/// A judge reaps by staleness (and by the definitive-dead cutoff) only once it has itself
/// watched the store for longer than the cutoff: only then could the peer have beaten.
pub async fn a_judge_reaps_by_staleness_only_after_watching_for_longer_than_the_cutoff(
    h: &dyn Harness,
) {
    let peer = instance(h).await;
    h.age_heartbeat(peer, STALE * 2).await;
    let young = instance(h).await;
    let _lock = take_lock(h, young).await;
    assert!(
        sweep_by(h, Some(young), Some(DEAD), Some(GRACE))
            .await
            .reaped
            .is_empty(),
        "a judge that has watched for seconds"
    );
    h.age_watch(young, STALE * 2).await;
    let out = sweep_by(h, Some(young), Some(DEAD), Some(GRACE)).await;
    assert_eq!(out.reaped.len(), 1);
    assert_eq!(out.reaped[0].instance, peer);
}

/// Each instance declares the cutoffs it is judged by; a sweep with smaller ones cannot
/// shorten them.
pub async fn a_peer_is_judged_by_the_cutoffs_it_declared(h: &dyn Harness) {
    judge(h).await;
    let patient = InstanceId::new();
    h.coordinator()
        .record_heartbeat(RecordHeartbeatParams {
            stale_after: Duration::from_secs(90),
            ..beat_params(patient, AliveLockReport::NotHeld, true)
        })
        .await
        .expect("beat");
    h.age_heartbeat(patient, Duration::from_secs(60)).await;
    assert!(
        sweep_with_grace(h).await.reaped.is_empty(),
        "stale by the sweep's 30 s, not by its own 90 s"
    );
    h.age_heartbeat(patient, Duration::from_secs(40)).await;
    let out = sweep_with_grace(h).await;
    assert_eq!(out.reaped.len(), 1);
    assert_eq!(out.reaped[0].instance, patient);
}

/// The store holds a floor for every cutoff (`liveness_floor`): a caller cannot reap its
/// peers with a cutoff of a microsecond, nor declare one for itself.
pub async fn liveness_cutoffs_below_the_store_floor_are_refused(h: &dyn Harness) {
    let tiny = Duration::from_micros(1);
    let c = h.coordinator();
    let refused = |e: Error, what: &str| {
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains(what) && m.contains("floor")),
            "{e}"
        );
    };
    for (stale, dead, grace, what) in [
        (tiny, Some(DEAD), Some(GRACE), "stale_after"),
        (STALE, Some(tiny), Some(GRACE), "dead_after"),
        (STALE, Some(DEAD), Some(tiny), "lock_grace"),
    ] {
        let err = c
            .cleanup_stale_instances(CleanupStaleInstancesParams {
                judge: None,
                stale_after: stale,
                dead_after: dead,
                lock_grace: grace,
            })
            .await
            .unwrap_err();
        refused(err, what);
        let err = c
            .record_heartbeat(RecordHeartbeatParams {
                stale_after: stale,
                dead_after: dead,
                lock_grace: grace,
                ..beat_params(InstanceId::new(), AliveLockReport::NotHeld, true)
            })
            .await
            .unwrap_err();
        refused(err, what);
        let err = c
            .maintenance_due(MaintenanceDueParams {
                judge: None,
                stale_after: stale,
                dead_after: dead,
                lock_grace: grace,
                completed_retention: DAY,
                dead_retention: DAY,
                evicted_retention: DAY,
            })
            .await
            .unwrap_err();
        refused(err, what);
    }
}

/// The NOTIFY queue's usage is a share between 0 and 1; a quiet store uses next to none.
pub async fn server_status_reports_the_notification_queue_usage(h: &dyn Harness) {
    let status = h
        .coordinator()
        .server_status(ServerStatusParams {})
        .await
        .expect("status");
    assert!(
        (0.0..0.5).contains(&status.notification_queue_usage),
        "{status:?}"
    );
}

/// The one-statement probe behind an idle sweep: each flag turns on with its kind of work.
pub async fn maintenance_due_flags_exactly_the_steps_that_have_work(h: &dyn Harness) {
    let judge = judge(h).await;
    let params = MaintenanceDueParams {
        judge: Some(judge),
        stale_after: STALE,
        dead_after: Some(DEAD),
        lock_grace: Some(GRACE),
        completed_retention: Duration::from_secs(3600),
        dead_retention: Duration::from_secs(7200),
        evicted_retention: Duration::from_secs(7200),
    };
    let due = || async { h.coordinator().maintenance_due(params).await.expect("due") };
    queue(h, "q", 1).await;
    let me = instance(h).await;
    assert_eq!(due().await, MaintenanceDueOutcome::default(), "idle");

    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(1)).run_after(Duration::from_secs(600)),
            NewWork::new("q", json!(2)),
            NewWork::new("q", json!(3)),
        ],
    )
    .await;
    h.set_run_at(ids[0], chrono::Duration::seconds(-1)).await;
    assert_eq!(
        due().await,
        MaintenanceDueOutcome {
            scheduled: true,
            ..Default::default()
        }
    );
    let claimed = claim(h, me, &["q"], 3).await;
    let by_id = |id| {
        claimed
            .items
            .iter()
            .find(|c| c.fence.id == id)
            .expect("claimed")
            .fence
    };
    complete(h, me, vec![by_id(ids[1])]).await;
    h.age_finished(ids[1], Duration::from_secs(3601)).await;
    h.set_lease_expiry(ids[2], chrono::Duration::seconds(-1))
        .await;
    let peer = instance(h).await;
    h.age_heartbeat(peer, STALE * 2).await;
    let flags = due().await;
    assert_eq!(
        flags,
        MaintenanceDueOutcome {
            instances: true,
            orphans: true,
            scheduled: false,
            finished: true,
            tombstones: false,
        }
    );
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
    h.age_eviction(peer, Duration::from_secs(7201)).await;
    assert!(due().await.tombstones);
    assert!(!due().await.instances);
}

/// Keys whose 64 bits read as a negative number are found in pg_locks like any other.
pub async fn alive_lock_keys_that_hash_to_negative_values_work(h: &dyn Harness) {
    // Find an instance whose key is negative (about half are); the fake has no keys.
    let mut me = InstanceId::new();
    for _ in 0..64 {
        match h.alive_lock_key(me).await {
            Some(k) if k >= 0 => me = InstanceId::new(),
            _ => break,
        }
    }
    if let Some(k) = h.alive_lock_key(me).await {
        assert!(k < 0, "found no negative key in 64 tries");
    }
    heartbeat(h, me).await;
    let lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take lock");
    assert!(lock.held);
    let alive = h
        .operations()
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("alive?");
    assert!(alive.alive);
    h.age_heartbeat(me, STALE * 2).await;
    assert!(cleanup(h, Some(DEAD)).await.reaped.is_empty());
}

/// Killing the lock's session releases the lock; the stale instance is then reaped.
pub async fn killing_the_alive_lock_session_releases_the_lock(h: &dyn Harness) {
    judge(h).await;
    let me = instance(h).await;
    let mut lock = h
        .coordinator()
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take lock");
    assert!(lock.held);
    h.kill_alive_lock_session(me).await;
    wait_until_not_alive(h, me).await;
    assert!(lock.session.retake().await.is_err(), "the session is gone");
    h.age_heartbeat(me, STALE * 2).await;
    assert!(
        cleanup(h, Some(DEAD)).await.reaped.is_empty(),
        "first sight"
    );
    h.age_lock_loss(me, Duration::from_secs(1)).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
}

/// One session holds an instance's lock; taking it again there is idempotent, another
/// session cannot have it until the first lets go.
pub async fn the_alive_lock_is_taken_once_per_session(h: &dyn Harness) {
    let me = instance(h).await;
    let c = h.coordinator();
    let mut first = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take");
    assert!(first.held);
    assert!(first.session.retake().await.expect("retake"));
    let mut second = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take");
    assert!(!second.held);
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !second.session.retake().await.expect("retake") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock was never freed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let alive = h
        .operations()
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("alive?");
    assert!(alive.alive);
}

async fn wait_until_not_alive(h: &dyn Harness, instance: InstanceId) {
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

// -- fenced outcomes --------------------------------------------------------------------------

/// After a reclaim, the old claim's complete, fail, release and checkpoint change nothing.
pub async fn a_zombies_outcomes_after_a_reclaim_are_fenced_out(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let zombie = instance(h).await;
    let peer = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let old = claim_one(h, zombie, "q").await.fence;
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    let new = claim_one(h, peer, "q").await.fence;
    let before = row(h, id).await;

    let c = complete(h, zombie, vec![old]).await;
    assert!(c.items[0].fenced_out());
    assert!(matches!(c.all_recorded(), Err(Error::FencedOut { id: i }) if i == id));
    assert_eq!(
        fail(h, zombie, old, "late", FailDisposition::DeadLetter).await,
        None
    );
    let released = h
        .coordinator()
        .release_work(ReleaseWorkParams {
            instance: zombie,
            items: vec![old],
            consume_attempt: false,
        })
        .await
        .expect("release");
    assert!(released.items[0].fenced_out());
    let cp = h
        .coordinator()
        .checkpoint_work(CheckpointWorkParams {
            instance: zombie,
            fence: old,
            checkpoint: json!({"cursor": 99}),
        })
        .await
        .unwrap_err();
    assert!(matches!(cp, Error::FencedOut { id: i } if i == id), "{cp}");
    // The peer's token under the zombie's instance is no better.
    assert!(complete(h, zombie, vec![new]).await.items[0].fenced_out());
    assert_eq!(row(h, id).await, before, "nothing changed");
    // The holder can still record.
    assert!(complete(h, peer, vec![new]).await.all_recorded().is_ok());
}

/// Success is recorded once; a second complete of the same claim is fenced out.
pub async fn complete_records_success_once(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let out = claim(h, me, &["q"], 2).await;
    let fences: Vec<Fence> = out.items.iter().map(|c| c.fence).collect();
    let done = complete(h, me, fences.clone()).await;
    assert_eq!(done.items.len(), 2);
    assert!(done.all_recorded().is_ok());
    for f in &fences {
        let r = row(h, f.id).await;
        assert_eq!(r.state, WorkState::Completed);
        assert!(r.finished && r.instance.is_none() && !r.has_lease);
    }
    assert!(complete(h, me, vec![fences[0]]).await.items[0].fenced_out());
    assert!(complete(h, me, vec![]).await.items.is_empty());
}

/// A failure with a retry delay schedules the item and appends the error.
pub async fn failure_with_retry_schedules_the_item_and_keeps_the_error(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let later = claim_one(h, me, "q").await.fence;
    let now = claim_one(h, me, "q").await.fence;
    assert_eq!(
        fail(
            h,
            me,
            later,
            "boom",
            FailDisposition::RetryAfter(Duration::from_secs(600))
        )
        .await,
        Some(WorkState::Scheduled)
    );
    assert_eq!(
        fail(
            h,
            me,
            now,
            "bang\0!",
            FailDisposition::RetryAfter(Duration::ZERO)
        )
        .await,
        Some(WorkState::Available)
    );
    let r = row(h, later.id).await;
    assert_eq!(
        (r.state, r.attempt, r.instance),
        (WorkState::Scheduled, 1, None)
    );
    assert_eq!(r.errors.len(), 1);
    assert_eq!(
        (
            r.errors[0].attempt,
            r.errors[0].kind.as_str(),
            r.errors[0].error.as_str()
        ),
        (1, "failed", "boom")
    );
    assert_eq!(r.errors[0].instance, Some(me.to_string()));
    // The NUL was replaced, not refused: an error message never loses the outcome.
    assert_eq!(row(h, now.id).await.errors[0].error, "bang\u{FFFD}!");
    // The available one runs again at once, as attempt 2; the scheduled one waits.
    let again = claim(h, me, &["q"], 10).await;
    assert_eq!(ids(&again), HashSet::from([now.id]));
    assert_eq!(again.items[0].attempt, 2);
}

/// At max_attempts a failure dead-letters the item with every attempt's error.
pub async fn failure_at_max_attempts_dead_letters_with_the_full_history(h: &dyn Harness) {
    queue(h, "q", 3).await;
    let me = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    for attempt in 1..=3 {
        let c = claim_one(h, me, "q").await;
        assert_eq!(c.attempt, attempt);
        let next = fail(
            h,
            me,
            c.fence,
            &format!("error {attempt}"),
            FailDisposition::RetryAfter(Duration::ZERO),
        )
        .await;
        let expected = if attempt < 3 {
            WorkState::Available
        } else {
            WorkState::Dead
        };
        assert_eq!(next, Some(expected));
    }
    let r = row(h, id).await;
    assert_eq!((r.state, r.attempt, r.finished), (WorkState::Dead, 3, true));
    let history: Vec<(i64, &str)> = r
        .errors
        .iter()
        .map(|e| (e.attempt, e.error.as_str()))
        .collect();
    assert_eq!(
        history,
        vec![(1, "error 1"), (2, "error 2"), (3, "error 3")]
    );
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());
}

/// "Don't retry" goes straight to the dead letters; "cancelled" ends cancelled.
pub async fn rejection_and_cancellation_finish_the_item(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let rejected = claim_one(h, me, "q").await.fence;
    let cancelled = claim_one(h, me, "q").await.fence;
    assert_eq!(
        fail(h, me, rejected, "bad input", FailDisposition::DeadLetter).await,
        Some(WorkState::Dead)
    );
    assert_eq!(
        fail(h, me, cancelled, "stopped", FailDisposition::Cancelled).await,
        Some(WorkState::Cancelled)
    );
    let r = row(h, rejected.id).await;
    assert_eq!((r.state, r.attempt, r.finished), (WorkState::Dead, 1, true));
    assert_eq!(r.errors[0].kind, "rejected");
    let c = row(h, cancelled.id).await;
    assert_eq!((c.state, c.finished), (WorkState::Cancelled, true));
    assert_eq!(c.errors[0].kind, "cancelled");
}

/// A drain's release gives the item back at once without counting the attempt.
pub async fn a_drained_release_does_not_consume_an_attempt(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let leaving = instance(h).await;
    let peer = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let old = claim_one(h, leaving, "q").await;
    let out = h
        .coordinator()
        .release_work(ReleaseWorkParams {
            instance: leaving,
            items: vec![old.fence],
            consume_attempt: false,
        })
        .await
        .expect("release");
    assert_eq!(out.items[0].state, Some(WorkState::Available));
    let r = row(h, id).await;
    assert_eq!(
        (r.state, r.attempt, r.instance),
        (WorkState::Available, 0, None)
    );
    let taken = claim_one(h, peer, "q").await;
    assert_eq!(taken.attempt, 1, "the attempt was not counted");
    assert!(!taken.reclaimed);
    assert_ne!(taken.fence.token, old.fence.token);
    assert!(complete(h, leaving, vec![old.fence]).await.items[0].fenced_out());
}

/// A counted release of the last attempt makes a dead letter.
pub async fn a_release_that_consumes_the_last_attempt_dead_letters(h: &dyn Harness) {
    queue(h, "q", 1).await;
    let me = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let c = claim_one(h, me, "q").await;
    let out = h
        .coordinator()
        .release_work(ReleaseWorkParams {
            instance: me,
            items: vec![c.fence],
            consume_attempt: true,
        })
        .await
        .expect("release");
    assert_eq!(out.items[0].state, Some(WorkState::Dead));
    assert_eq!(row(h, id).await.errors[0].kind, "released");
}

/// A checkpoint saved by one attempt is what the next attempt starts with.
pub async fn a_checkpoint_reaches_the_next_attempt(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let first = claim_one(h, a, "q").await;
    assert_eq!(first.checkpoint, None);
    h.coordinator()
        .checkpoint_work(CheckpointWorkParams {
            instance: a,
            fence: first.fence,
            checkpoint: json!({"cursor": 41}),
        })
        .await
        .expect("checkpoint");
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    let second = claim_one(h, b, "q").await;
    assert_eq!(second.checkpoint, Some(json!({"cursor": 41})));
    h.coordinator()
        .checkpoint_work(CheckpointWorkParams {
            instance: b,
            fence: second.fence,
            checkpoint: Value::Null,
        })
        .await
        .expect("clear checkpoint");
    assert_eq!(row(h, id).await.checkpoint, None);
}

// -- enqueue_work -----------------------------------------------------------------------------

/// Ten thousand items go in one call, in order, each with its own id.
pub async fn bulk_enqueue_of_ten_thousand_items_in_one_call(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let ids = enqueue_n(h, "q", 10_000).await;
    assert_eq!(ids.len(), 10_000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 10_000);
    assert_eq!(h.work_count().await, 10_000);
    assert_eq!(row(h, ids[1234]).await.payload, json!({"n": 1234}));
    assert_eq!(row(h, ids[9999]).await.payload, json!({"n": 9999}));
}

/// Bad input gets an error that names it, and nothing is written.
pub async fn enqueue_refuses_unknown_queues_oversized_batches_and_invalid_payloads_and_writes_nothing(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let c = h.coordinator();
    let try_enqueue = |items: Vec<NewWork>| {
        let c = c.clone();
        async move { c.enqueue_work(EnqueueWorkParams { items }).await }
    };
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1)),
        NewWork::new("nope", json!(2)),
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "nope"),
        "{err}"
    );
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1));
        crate::MAX_ENQUEUE_BATCH + 1
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("exceeds the maximum")),
        "{err}"
    );
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1)),
        NewWork::new("q", json!({"text": "nul \u{0} here"})),
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("item 1") && m.contains("NUL")),
        "{err}"
    );
    let err = try_enqueue(vec![NewWork::new("bad name!", json!(1))])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("queue name")),
        "{err}"
    );
    let err = try_enqueue(vec![]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(h.work_count().await, 0, "nothing was written");
}

/// A unique key holds while its item is unfinished.
pub async fn a_unique_key_returns_the_existing_item_while_it_is_unfinished(h: &dyn Harness) {
    queue(h, "q", 10).await;
    queue(h, "other", 10).await;
    let me = instance(h).await;
    let c = h.coordinator();
    let first = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![
                NewWork::new("q", json!(1)).unique_key("k"),
                NewWork::new("q", json!(2)).unique_key("k"),
                NewWork::new("other", json!(3)).unique_key("k"),
            ],
        })
        .await
        .expect("enqueue")
        .items;
    assert!(first[0].inserted);
    assert_eq!(
        first[1],
        Enqueued {
            id: first[0].id,
            inserted: false
        }
    );
    assert!(first[2].inserted && first[2].id != first[0].id);
    let running = claim_one(h, me, "q").await;
    let again = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(4)).unique_key("k")],
        })
        .await
        .expect("enqueue")
        .items[0];
    assert_eq!(
        again,
        Enqueued {
            id: first[0].id,
            inserted: false
        }
    );
    assert_eq!(h.work_count().await, 2);
    complete(h, me, vec![running.fence]).await;
    let after = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(5)).unique_key("k")],
        })
        .await
        .expect("enqueue")
        .items[0];
    assert!(after.inserted && after.id != first[0].id);
}

/// Delays and priorities land as given; max_attempts defaults to the queue's.
pub async fn scheduled_items_are_scheduled_and_priorities_kept(h: &dyn Harness) {
    queue(h, "q", 7).await;
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(1))
                .run_after(Duration::from_secs(60))
                .priority(3),
            NewWork::new("q", json!(2)).max_attempts(2),
        ],
    )
    .await;
    let a = row(h, ids[0]).await;
    assert_eq!(
        (a.state, a.priority, a.max_attempts),
        (WorkState::Scheduled, 3, 7)
    );
    let b = row(h, ids[1]).await;
    assert_eq!((b.state, b.max_attempts), (WorkState::Available, 2));
}

/// Deregistering releases what the instance still held and deletes its row.
pub async fn deregistering_releases_leases_and_deletes_the_instance(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    claim(h, me, &["q"], 2).await;
    let out = h
        .coordinator()
        .deregister_instance(DeregisterInstanceParams { instance: me })
        .await
        .expect("deregister");
    assert_eq!(out.released, 2);
    assert!(!h.instance_registered(me).await);
    // Leaving is not eviction: a later heartbeat registers it again.
    assert!(!heartbeat(h, me).await.evicted);
}

// -- maintenance: promote_scheduled / dead_letter_expired / prune_finished / queue_depth ----

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn counts(pairs: &[(&str, u64)]) -> Vec<QueueCount> {
    pairs
        .iter()
        .map(|(q, n)| QueueCount {
            queue: q.to_string(),
            items: *n,
        })
        .collect()
}

async fn promote(h: &dyn Harness, limit: u32) -> PromoteScheduledOutcome {
    h.coordinator()
        .promote_scheduled(PromoteScheduledParams { limit })
        .await
        .expect("promote")
}

async fn dead_letter(h: &dyn Harness, limit: u32) -> DeadLetterExpiredOutcome {
    h.coordinator()
        .dead_letter_expired(DeadLetterExpiredParams { limit })
        .await
        .expect("dead-letter")
}

async fn prune(h: &dyn Harness, limit: u32) -> PruneFinishedOutcome {
    h.coordinator()
        .prune_finished(PruneFinishedParams {
            completed_retention: DAY,
            dead_retention: 7 * DAY,
            limit,
        })
        .await
        .expect("prune")
}

/// Enqueues `n` items due in an hour.
async fn enqueue_later(h: &dyn Harness, q: &str, n: usize) -> Vec<WorkId> {
    enqueue(
        h,
        (0..n)
            .map(|i| NewWork::new(q, json!({ "n": i })).run_after(HOUR))
            .collect(),
    )
    .await
}

/// Waits for the next wake signal, skipping `Connected`.
async fn next_wake(listener: &mut Box<dyn crate::WakeListener>) -> String {
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

/// Due scheduled items (delays and retries) become available, in every queue; items not yet
/// due stay scheduled; claimers of each queue with promoted items are woken once.
pub async fn promotion_moves_only_due_scheduled_items_and_wakes_their_claimers(h: &dyn Harness) {
    queue(h, "q", 10).await;
    queue(h, "other", 10).await;
    let me = instance(h).await;
    let later = enqueue_later(h, "q", 3).await;
    let elsewhere = enqueue_later(h, "other", 1).await[0];
    // A retry in backoff is a scheduled item too.
    enqueue_n(h, "q", 1).await;
    let retry = claim_one(h, me, "q").await.fence;
    let state = fail(h, me, retry, "boom", FailDisposition::RetryAfter(HOUR)).await;
    assert_eq!(state, Some(WorkState::Scheduled));

    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("listen"),
        ListenEvent::Connected
    );
    assert_eq!(promote(h, 100).await.promoted(), 0, "nothing is due yet");
    for id in [later[0], later[1], elsewhere, retry.id] {
        h.set_run_at(id, chrono::Duration::seconds(-1)).await;
    }
    let out = promote(h, 100).await;
    assert_eq!(out.queues, counts(&[("other", 1), ("q", 3)]));
    assert_eq!(out.promoted(), 4);
    for id in [later[0], later[1], elsewhere, retry.id] {
        assert_eq!(row(h, id).await.state, WorkState::Available);
    }
    assert_eq!(row(h, later[2]).await.state, WorkState::Scheduled);
    let mut woken = vec![
        next_wake(&mut listener).await,
        next_wake(&mut listener).await,
    ];
    woken.sort();
    assert_eq!(woken, vec!["other".to_string(), "q".to_string()]);
    assert_eq!(promote(h, 100).await, PromoteScheduledOutcome::default());
    // The promoted retry keeps its history and runs as its next attempt.
    let again = claim(h, me, &["q"], 10).await;
    let retried = again
        .items
        .iter()
        .find(|c| c.fence.id == retry.id)
        .expect("the retry is claimable");
    assert_eq!(retried.attempt, 2);
    assert_eq!(row(h, retry.id).await.errors.len(), 1);
}

/// At most `limit` items per call, the longest due first.
pub async fn promotion_takes_at_most_limit_items_oldest_first(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let ids = enqueue_later(h, "q", 5).await;
    for (i, id) in ids.iter().enumerate() {
        // ids[4] has been due longest, ids[0] the shortest.
        h.set_run_at(*id, chrono::Duration::seconds(-10 * (i as i64 + 1)))
            .await;
    }
    assert_eq!(promote(h, 2).await.promoted(), 2);
    let available: Vec<WorkId> = {
        let mut v = Vec::new();
        for id in &ids {
            if row(h, *id).await.state == WorkState::Available {
                v.push(*id);
            }
        }
        v
    };
    assert_eq!(available, vec![ids[3], ids[4]]);
    assert_eq!(promote(h, 2).await.promoted(), 2);
    assert_eq!(promote(h, 2).await.promoted(), 1);
    assert_eq!(promote(h, 2).await.promoted(), 0);
}

/// Sweeps running at once (one per instance) promote every due item exactly once.
pub async fn concurrent_sweeps_promote_each_due_item_exactly_once(h: &dyn Harness) {
    queue(h, "q", 10).await;
    const ITEMS: usize = 1000;
    let ids = enqueue(
        h,
        (0..ITEMS)
            .map(|i| {
                NewWork::new("q", json!({ "n": i }))
                    .run_at(chrono::Utc::now() + chrono::Duration::hours(1))
            })
            .collect(),
    )
    .await;
    for id in &ids {
        h.set_run_at(*id, chrono::Duration::seconds(-1)).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = h.coordinator();
        tasks.push(tokio::spawn(async move {
            let mut mine = 0;
            loop {
                let n = c
                    .promote_scheduled(PromoteScheduledParams { limit: 50 })
                    .await
                    .expect("promote")
                    .promoted();
                if n == 0 {
                    return mine;
                }
                mine += n;
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("sweeper");
    }
    assert_eq!(total, ITEMS as u64);
    let me = instance(h).await;
    assert_eq!(claim(h, me, &["q"], 10_000).await.items.len(), ITEMS);
}

/// An orphan with no attempts left becomes a dead letter whichever queue it is in, whether
/// its lease expired or was released; live leases and orphans with attempts left stay.
pub async fn expired_leases_with_attempts_used_up_become_dead_letters_in_every_queue(
    h: &dyn Harness,
) {
    queue(h, "last", 1).await;
    queue(h, "more", 10).await;
    let owner = instance(h).await;
    let gone = instance(h).await;
    let [expired, live] = enqueue_n(h, "last", 2).await[..] else {
        unreachable!()
    };
    let expired_claim = claim_one(h, owner, "last").await.fence;
    assert_eq!(expired_claim.id, expired);
    claim_one(h, owner, "last").await;
    let released = enqueue_n(h, "last", 1).await[0];
    claim_one(h, gone, "last").await;
    let with_attempts_left = enqueue_n(h, "more", 1).await[0];
    claim_one(h, owner, "more").await;
    h.set_lease_expiry(expired, chrono::Duration::seconds(-1))
        .await;
    h.set_lease_expiry(with_attempts_left, chrono::Duration::seconds(-1))
        .await;
    h.age_heartbeat(gone, STALE * 2).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);

    let out = dead_letter(h, 100).await;
    assert_eq!(out.dead, counts(&[("last", 2)]));
    assert!(out.cancelled.is_empty());
    assert_eq!((out.dead_lettered(), out.ended()), (2, 2));
    for id in [expired, released] {
        let r = row(h, id).await;
        assert_eq!(r.state, WorkState::Dead);
        assert!(r.finished && r.instance.is_none() && !r.has_lease);
        let last = r.errors.last().expect("an error entry");
        assert_eq!((last.kind.as_str(), last.attempt), ("lease_expired", 1));
        assert!(last.error.contains("no attempts left"), "{}", last.error);
    }
    assert_eq!(row(h, live).await.state, WorkState::Running);
    assert_eq!(row(h, with_attempts_left).await.state, WorkState::Running);
    // The late owner's outcome no longer lands.
    assert!(complete(h, owner, vec![expired_claim]).await.items[0].fenced_out());
    assert_eq!(
        dead_letter(h, 100).await,
        DeadLetterExpiredOutcome::default()
    );
}

/// An orphan whose cancel was requested ends cancelled; at most `limit` per call.
pub async fn expired_leases_of_cancelled_items_end_cancelled_and_the_limit_holds(h: &dyn Harness) {
    queue(h, "q", 1).await;
    let owner = instance(h).await;
    let ids = enqueue_n(h, "q", 3).await;
    claim(h, owner, &["q"], 3).await;
    h.request_cancel(ids[0]).await;
    for id in &ids {
        h.set_lease_expiry(*id, chrono::Duration::seconds(-1)).await;
    }
    let first = dead_letter(h, 2).await;
    assert_eq!(first.ended(), 2);
    let second = dead_letter(h, 2).await;
    assert_eq!(second.ended(), 1);
    assert_eq!(first.cancelled() + second.cancelled(), 1);
    assert_eq!(first.dead_lettered() + second.dead_lettered(), 2);
    let r = row(h, ids[0]).await;
    assert_eq!((r.state, r.finished), (WorkState::Cancelled, true));
    assert_eq!(
        r.errors.last().map(|e| e.error.as_str()),
        Some("lease expired after a cancel was requested")
    );
}

/// Finished items go once past their retention (completed 24 h, dead and cancelled 7 days
/// here); younger ones and unfinished ones stay.
pub async fn pruning_deletes_only_finished_items_past_their_retention(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue_n(h, "q", 6).await;
    let claimed = claim(h, me, &["q"], 5).await;
    let fence = |id: WorkId| {
        claimed
            .items
            .iter()
            .find(|c| c.fence.id == id)
            .expect("claimed")
            .fence
    };
    let [old_done, new_done, old_dead, young_dead, old_cancelled, waiting] = ids[..] else {
        unreachable!()
    };
    complete(h, me, vec![fence(old_done), fence(new_done)]).await;
    fail(h, me, fence(old_dead), "x", FailDisposition::DeadLetter).await;
    fail(h, me, fence(young_dead), "x", FailDisposition::DeadLetter).await;
    fail(h, me, fence(old_cancelled), "x", FailDisposition::Cancelled).await;
    h.age_finished(old_done, DAY + HOUR).await;
    h.age_finished(new_done, DAY - HOUR).await;
    h.age_finished(old_dead, 7 * DAY + HOUR).await;
    h.age_finished(young_dead, 2 * DAY).await;
    h.age_finished(old_cancelled, 7 * DAY + HOUR).await;

    let out = prune(h, 100).await;
    assert_eq!(
        out,
        PruneFinishedOutcome {
            completed: 1,
            dead: 1,
            cancelled: 1
        }
    );
    assert_eq!(out.pruned(), 3);
    for id in [old_done, old_dead, old_cancelled] {
        assert_eq!(h.work_row(id).await, None, "item {id} was pruned");
    }
    for id in [new_done, young_dead, waiting] {
        assert!(h.work_row(id).await.is_some(), "item {id} was kept");
    }
    assert_eq!(prune(h, 100).await, PruneFinishedOutcome::default());
}

/// Completed items go first; one call deletes at most `limit`.
pub async fn pruning_takes_completed_items_first_and_at_most_limit(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 4).await;
    let claimed = claim(h, me, &["q"], 4).await;
    let f: Vec<Fence> = claimed.items.iter().map(|c| c.fence).collect();
    complete(h, me, vec![f[0], f[1], f[2]]).await;
    fail(h, me, f[3], "x", FailDisposition::DeadLetter).await;
    for c in &f {
        h.age_finished(c.id, 8 * DAY).await;
    }
    assert_eq!(
        prune(h, 2).await,
        PruneFinishedOutcome {
            completed: 2,
            ..Default::default()
        }
    );
    assert_eq!(
        prune(h, 2).await,
        PruneFinishedOutcome {
            completed: 1,
            dead: 1,
            cancelled: 0
        }
    );
    assert_eq!(h.work_count().await, 0);
}

/// Tombstones older than the retention go; a heartbeat from that instance then registers it
/// again, while a younger tombstone still reports eviction.
pub async fn pruning_tombstones_forgets_only_old_evictions(h: &dyn Harness) {
    let old = instance(h).await;
    let recent = instance(h).await;
    let _peer = instance(h).await;
    h.age_heartbeat(old, STALE * 2).await;
    h.age_heartbeat(recent, STALE * 2).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 2);
    h.age_eviction(old, 7 * DAY + HOUR).await;
    let c = h.coordinator();
    let pruned = c
        .prune_evicted_instances(PruneEvictedInstancesParams {
            retention: 7 * DAY,
            limit: 100,
        })
        .await
        .expect("prune tombstones");
    assert_eq!(pruned.pruned, 1);
    assert!(heartbeat(h, recent).await.evicted);
    assert!(!heartbeat(h, old).await.evicted);
    assert!(h.instance_registered(old).await);
}

/// Every registered queue with each waiting or running state, zero included.
pub async fn queue_depth_counts_waiting_and_running_items_per_queue(h: &dyn Harness) {
    queue(h, "a", 10).await;
    queue(h, "b", 10).await;
    queue(h, "c", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "a", 4).await;
    let claimed = claim(h, me, &["a"], 2).await;
    complete(h, me, vec![claimed.items[0].fence]).await;
    enqueue_later(h, "a", 1).await;
    enqueue_later(h, "b", 2).await;
    let out = h
        .coordinator()
        .queue_depth(QueueDepthParams::default())
        .await
        .expect("queue depth");
    let got: Vec<(&str, WorkState, u64)> = out
        .depths
        .iter()
        .map(|d| (d.queue.as_str(), d.state, d.items))
        .collect();
    use WorkState::{Available, Running, Scheduled};
    assert_eq!(
        got,
        vec![
            ("a", Available, 2),
            ("a", Scheduled, 1),
            ("a", Running, 1),
            ("b", Available, 0),
            ("b", Scheduled, 2),
            ("b", Running, 0),
            ("c", Available, 0),
            ("c", Scheduled, 0),
            ("c", Running, 0),
        ]
    );
    assert_eq!(out.get("b", Scheduled), 2);
    assert_eq!(out.get("nope", Running), 0);
}

// -- operator: cancel_work / retry_dead_work / discard_work ---------------------------------

async fn cancel(h: &dyn Harness, id: WorkId) -> Result<CancelWorkOutcome> {
    h.operations().cancel_work(CancelWorkParams { id }).await
}

async fn retry(h: &dyn Harness, id: WorkId) -> Result<RetryDeadWorkOutcome> {
    h.operations()
        .retry_dead_work(RetryDeadWorkParams { id })
        .await
}

async fn discard(h: &dyn Harness, id: WorkId) -> Result<DiscardWorkOutcome> {
    h.operations().discard_work(DiscardWorkParams { id }).await
}

fn assert_invalid_state(err: Error, want_id: WorkId, want_state: WorkState, reason_has: &str) {
    match &err {
        Error::InvalidState { id, state, reason } => {
            assert_eq!((*id, *state), (want_id, want_state), "{err}");
            assert!(reason.contains(reason_has), "{err}");
            assert!(!err.is_transient());
        }
        other => panic!("expected InvalidState for item {want_id}, got {other}"),
    }
}

fn assert_not_found(err: Error, want_id: WorkId) {
    assert!(
        matches!(err, Error::NotFound { id } if id == want_id),
        "expected NotFound for item {want_id}, got {err}"
    );
}

/// An available or scheduled item is cancelled at once and never runs.
pub async fn cancel_of_a_waiting_item_cancels_it_at_once(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let now = enqueue_n(h, "q", 1).await[0];
    let later = enqueue_later(h, "q", 1).await[0];
    for id in [now, later] {
        let out = cancel(h, id).await.expect("cancel");
        assert_eq!(out.cancellation, Cancellation::Cancelled);
        let r = row(h, id).await;
        assert_eq!((r.state, r.finished), (WorkState::Cancelled, true));
        assert_eq!(
            r.errors.last().map(|e| (e.kind.as_str(), e.attempt)),
            Some(("cancelled", 0))
        );
    }
    h.set_run_at(later, chrono::Duration::seconds(-1)).await;
    assert_eq!(promote(h, 10).await.promoted(), 0);
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());
}

/// A running item's cancel is requested: the owner hears it in its next renewal reply and
/// records the item cancelled; an orphan whose cancel was requested ends cancelled.
pub async fn cancel_of_a_running_item_is_requested_and_reaches_its_owner(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let running = claim_one(h, me, "q").await.fence;
    let orphan = claim_one(h, me, "q").await.fence;
    for _ in 0..2 {
        let out = cancel(h, running.id).await.expect("cancel");
        assert_eq!(out.cancellation, Cancellation::Requested);
    }
    let r = row(h, running.id).await;
    assert_eq!(
        (r.state, r.cancel_requested, r.instance),
        (WorkState::Running, true, Some(me))
    );
    let reply = renew(h, me, vec![running]).await;
    assert_eq!(reply[0].status, RenewalStatus::Renewed);
    assert!(reply[0].cancel_requested);
    assert_eq!(
        fail(h, me, running, "stopped", FailDisposition::Cancelled).await,
        Some(WorkState::Cancelled)
    );

    assert_eq!(
        cancel(h, orphan.id).await.expect("cancel").cancellation,
        Cancellation::Requested
    );
    h.set_lease_expiry(orphan.id, chrono::Duration::seconds(-1))
        .await;
    let ended = dead_letter(h, 10).await;
    assert_eq!(ended.cancelled, counts(&[("q", 1)]));
    assert_eq!(row(h, orphan.id).await.state, WorkState::Cancelled);
}

/// A finished item refuses the cancel with its state; an unknown id is not found.
pub async fn cancel_of_a_finished_or_unknown_item_is_refused(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 3).await;
    let done = claim_one(h, me, "q").await.fence;
    let dead = claim_one(h, me, "q").await.fence;
    let cancelled = claim_one(h, me, "q").await.fence;
    complete(h, me, vec![done]).await;
    fail(h, me, dead, "x", FailDisposition::DeadLetter).await;
    fail(h, me, cancelled, "x", FailDisposition::Cancelled).await;
    for (id, state) in [
        (done.id, WorkState::Completed),
        (dead.id, WorkState::Dead),
        (cancelled.id, WorkState::Cancelled),
    ] {
        let before = row(h, id).await;
        let err = cancel(h, id).await.unwrap_err();
        assert_invalid_state(err, id, state, "finished");
        assert_eq!(row(h, id).await, before, "nothing changed");
    }
    assert_not_found(cancel(h, 987_654_321).await.unwrap_err(), 987_654_321);
}

/// A retried dead letter is available again with fresh attempts; its history is kept with a
/// `retried` note, and the next attempts add to it.
pub async fn a_retried_dead_letter_is_claimable_again_with_fresh_attempts_and_its_history(
    h: &dyn Harness,
) {
    queue(h, "q", 2).await;
    let me = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    for n in 1..=2 {
        let c = claim_one(h, me, "q").await;
        fail(
            h,
            me,
            c.fence,
            &format!("error {n}"),
            FailDisposition::RetryAfter(Duration::ZERO),
        )
        .await;
    }
    assert_eq!(row(h, id).await.state, WorkState::Dead);
    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("listen"),
        ListenEvent::Connected
    );
    let out = retry(h, id).await.expect("retry");
    assert_eq!(out.queue, "q");
    assert_eq!(next_wake(&mut listener).await, "q");
    let r = row(h, id).await;
    assert_eq!(
        (r.state, r.attempt, r.finished, r.cancel_requested),
        (WorkState::Available, 0, false, false)
    );
    let kinds: Vec<(&str, i64)> = r
        .errors
        .iter()
        .map(|e| (e.kind.as_str(), e.attempt))
        .collect();
    assert_eq!(kinds, vec![("failed", 1), ("failed", 2), ("retried", 2)]);
    let again = claim_one(h, me, "q").await;
    assert_eq!(
        (again.fence.id, again.attempt, again.reclaimed),
        (id, 1, false)
    );
    fail(h, me, again.fence, "error 3", FailDisposition::DeadLetter).await;
    let r = row(h, id).await;
    assert_eq!(r.state, WorkState::Dead);
    assert_eq!(r.errors.len(), 4);
}

/// Only dead letters are retried; a retry that would make a second unfinished item with the
/// same unique key is refused.
pub async fn retry_refuses_items_that_are_not_dead_letters_or_whose_unique_key_is_taken(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let waiting = enqueue_n(h, "q", 1).await[0];
    let err = retry(h, waiting).await.unwrap_err();
    assert_invalid_state(err, waiting, WorkState::Available, "dead letter");
    let keyed = enqueue(h, vec![NewWork::new("q", json!(1)).unique_key("k")]).await[0];
    let claimed = claim(h, me, &["q"], 10).await;
    let fence = claimed
        .items
        .iter()
        .find(|c| c.fence.id == keyed)
        .expect("claimed")
        .fence;
    let err = retry(h, keyed).await.unwrap_err();
    assert_invalid_state(err, keyed, WorkState::Running, "dead letter");
    fail(h, me, fence, "x", FailDisposition::DeadLetter).await;
    // The key is free once the item is dead: a new item takes it.
    let newer = enqueue(h, vec![NewWork::new("q", json!(2)).unique_key("k")]).await[0];
    assert_ne!(newer, keyed);
    let err = retry(h, keyed).await.unwrap_err();
    assert_invalid_state(err, keyed, WorkState::Dead, "unique key");
    assert_eq!(row(h, keyed).await.state, WorkState::Dead);
    cancel(h, newer).await.expect("cancel");
    retry(h, keyed).await.expect("the key is free again");
    assert_eq!(row(h, keyed).await.state, WorkState::Available);
    assert_not_found(retry(h, 987_654_321).await.unwrap_err(), 987_654_321);
}

/// Finished items (completed, dead, cancelled) are deleted; unfinished ones are refused.
pub async fn discard_deletes_finished_items_and_refuses_unfinished_ones(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue_n(h, "q", 5).await;
    let done = claim_one(h, me, "q").await.fence;
    let dead = claim_one(h, me, "q").await.fence;
    let running = claim_one(h, me, "q").await.fence;
    complete(h, me, vec![done]).await;
    fail(h, me, dead, "x", FailDisposition::DeadLetter).await;
    cancel(h, ids[3]).await.expect("cancel");
    let available = ids[4];
    for (id, state) in [
        (done.id, WorkState::Completed),
        (dead.id, WorkState::Dead),
        (ids[3], WorkState::Cancelled),
    ] {
        assert_eq!(discard(h, id).await.expect("discard").state, state);
        assert_eq!(h.work_row(id).await, None);
        assert_not_found(discard(h, id).await.unwrap_err(), id);
    }
    for (id, state) in [
        (running.id, WorkState::Running),
        (available, WorkState::Available),
    ] {
        let err = discard(h, id).await.unwrap_err();
        assert_invalid_state(err, id, state, "cancel it first");
        assert_eq!(row(h, id).await.state, state);
    }
}

/// Limits outside 1..=10 000 and empty retentions are refused with messages naming them.
pub async fn maintenance_calls_refuse_bad_limits_and_retentions(h: &dyn Harness) {
    let c = h.coordinator();
    for limit in [0, MAX_SWEEP_BATCH + 1] {
        let errs = [
            c.promote_scheduled(PromoteScheduledParams { limit })
                .await
                .unwrap_err(),
            c.dead_letter_expired(DeadLetterExpiredParams { limit })
                .await
                .unwrap_err(),
            c.prune_finished(PruneFinishedParams {
                completed_retention: DAY,
                dead_retention: DAY,
                limit,
            })
            .await
            .unwrap_err(),
            c.prune_evicted_instances(PruneEvictedInstancesParams {
                retention: DAY,
                limit,
            })
            .await
            .unwrap_err(),
        ];
        for err in errs {
            assert!(
                matches!(&err, Error::InvalidArgument(m) if m.contains("limit")),
                "{err}"
            );
        }
    }
    let err = c
        .prune_finished(PruneFinishedParams {
            completed_retention: DAY,
            dead_retention: Duration::ZERO,
            limit: 1,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("dead_retention")),
        "{err}"
    );
    let err = c
        .prune_evicted_instances(PruneEvictedInstancesParams {
            retention: Duration::ZERO,
            limit: 1,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("retention")),
        "{err}"
    );
}

// -- issue 11: evicted renewals, repeated pairs, cancels that survive a retry or a release -------

/// An instance that was reaped (deleted and tombstoned) gets `evicted` for every lease it
/// renews — the lease it held, a forged token, anything — and nothing is renewed: the
/// instance is gone, and every lease with it. Its peers are not affected.
pub async fn renewal_by_an_evicted_instance_answers_evicted_for_every_lease(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let gone = instance(h).await;
    let peer = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let held: Vec<Fence> = claim(h, gone, &["q"], 2)
        .await
        .items
        .iter()
        .map(|c| c.fence)
        .collect();
    assert_eq!(held.len(), 2);
    h.age_heartbeat(gone, STALE * 2).await;
    let reaped: Vec<InstanceId> = cleanup(h, Some(DEAD))
        .await
        .reaped
        .iter()
        .map(|r| r.instance)
        .collect();
    assert_eq!(reaped, vec![gone]);
    let forged = Fence {
        id: held[0].id,
        token: held[0].token + 1_000_000,
    };
    let replies: Vec<(Fence, RenewalStatus, bool)> = renew(h, gone, vec![held[0], held[1], forged])
        .await
        .iter()
        .map(|r| (r.fence, r.status, r.cancel_requested))
        .collect();
    use RenewalStatus::Evicted;
    assert_eq!(
        replies,
        vec![
            (held[0], Evicted, false),
            (held[1], Evicted, false),
            (forged, Evicted, false)
        ]
    );
    for f in &held {
        assert_eq!(row(h, f.id).await.renewals, 0, "nothing was renewed");
    }
    // The peer takes the items over and renews its own leases as usual.
    let taken = claim(h, peer, &["q"], 10).await;
    assert_eq!(ids(&taken), held.iter().map(|f| f.id).collect());
    let fences: Vec<Fence> = taken.items.iter().map(|c| c.fence).collect();
    assert!(renew(h, peer, fences)
        .await
        .iter()
        .all(|r| r.status == RenewalStatus::Renewed));
}

/// A pair given twice in one call is answered once, in the order of its first occurrence,
/// and only its first disposition is applied: complete_work, fail_work, release_work and
/// renew_leases alike.
pub async fn a_repeated_pair_is_answered_once_and_its_first_disposition_wins(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 5).await;
    let f: Vec<Fence> = claim(h, me, &["q"], 5)
        .await
        .items
        .iter()
        .map(|c| c.fence)
        .collect();
    let (a, b, c, d, e) = (f[0], f[1], f[2], f[3], f[4]);
    let answers = |batch: OutcomeBatch| -> Vec<(Fence, Option<WorkState>)> {
        batch.items.iter().map(|r| (r.fence, r.state)).collect()
    };

    let done = complete(h, me, vec![a, b, a]).await;
    assert_eq!(
        answers(done),
        vec![
            (a, Some(WorkState::Completed)),
            (b, Some(WorkState::Completed))
        ]
    );

    let failure = |fence, error: &str, disposition| Failure {
        fence,
        error: error.into(),
        disposition,
    };
    let failed = h
        .coordinator()
        .fail_work(FailWorkParams {
            instance: me,
            items: vec![
                failure(c, "first", FailDisposition::RetryAfter(Duration::ZERO)),
                failure(d, "other", FailDisposition::DeadLetter),
                failure(c, "second", FailDisposition::DeadLetter),
            ],
        })
        .await
        .expect("fail");
    assert_eq!(
        answers(failed),
        vec![(c, Some(WorkState::Available)), (d, Some(WorkState::Dead))]
    );
    let r = row(h, c.id).await;
    assert_eq!(r.state, WorkState::Available, "the first disposition won");
    let history: Vec<(&str, &str)> = r
        .errors
        .iter()
        .map(|e| (e.kind.as_str(), e.error.as_str()))
        .collect();
    assert_eq!(history, vec![("failed", "first")]);

    let released = h
        .coordinator()
        .release_work(ReleaseWorkParams {
            instance: me,
            items: vec![e, e],
            consume_attempt: false,
        })
        .await
        .expect("release");
    assert_eq!(answers(released), vec![(e, Some(WorkState::Available))]);
    assert_eq!(
        row(h, e.id).await.attempt,
        0,
        "released once: one attempt given back"
    );

    let again: Vec<Fence> = claim(h, me, &["q"], 10)
        .await
        .items
        .iter()
        .map(|c| c.fence)
        .collect();
    assert_eq!(again.len(), 2);
    let (x, y) = (again[0], again[1]);
    let replies: Vec<(Fence, RenewalStatus)> = renew(h, me, vec![x, y, x, x])
        .await
        .iter()
        .map(|r| (r.fence, r.status))
        .collect();
    assert_eq!(
        replies,
        vec![(x, RenewalStatus::Renewed), (y, RenewalStatus::Renewed)]
    );
    assert_eq!(row(h, x.id).await.renewals, 1, "renewed once");
    assert_eq!(row(h, y.id).await.renewals, 1);
}

/// An operator's cancel is never lost to a retry or a release: a cancel-requested item whose
/// attempt fails (retry at once, retry later, rejection) or whose lease is released (drained
/// or counted) ends cancelled, with the attempt's one history entry (kind `cancelled`) saying
/// why, and is never claimed again. A handler that reports the cancel itself ends it
/// cancelled as before.
pub async fn a_cancel_requested_item_that_fails_or_is_released_ends_cancelled_and_says_why(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 6).await;
    let f: Vec<Fence> = claim(h, me, &["q"], 6)
        .await
        .items
        .iter()
        .map(|c| c.fence)
        .collect();
    for fence in &f {
        assert_eq!(
            cancel(h, fence.id).await.expect("cancel").cancellation,
            Cancellation::Requested
        );
    }
    let retry_now = FailDisposition::RetryAfter(Duration::ZERO);
    let retry_later = FailDisposition::RetryAfter(Duration::from_secs(600));
    assert_eq!(
        fail(h, me, f[0], "boom", retry_now).await,
        Some(WorkState::Cancelled)
    );
    assert_eq!(
        fail(h, me, f[1], "boom", retry_later).await,
        Some(WorkState::Cancelled)
    );
    assert_eq!(
        fail(h, me, f[2], "bad input", FailDisposition::DeadLetter).await,
        Some(WorkState::Cancelled)
    );
    assert_eq!(
        fail(h, me, f[3], "stopped", FailDisposition::Cancelled).await,
        Some(WorkState::Cancelled)
    );
    for (fence, consume_attempt) in [(f[4], false), (f[5], true)] {
        let out = h
            .coordinator()
            .release_work(ReleaseWorkParams {
                instance: me,
                items: vec![fence],
                consume_attempt,
            })
            .await
            .expect("release");
        assert_eq!(out.items[0].state, Some(WorkState::Cancelled));
    }
    for fence in &f {
        let r = row(h, fence.id).await;
        assert_eq!(
            (r.state, r.finished, r.instance, r.has_lease, r.attempt),
            (WorkState::Cancelled, true, None, false, 1),
            "item {}",
            fence.id
        );
        let last = r.errors.last().expect("a history entry");
        assert_eq!(last.kind, "cancelled", "item {}: {:?}", fence.id, r.errors);
        assert_eq!(last.instance, Some(me.to_string()));
    }
    // One entry per attempt: it says why the item ended cancelled, and keeps the attempt's
    // error.
    let history = |id: WorkId| async move {
        row(h, id)
            .await
            .errors
            .iter()
            .map(|e| (e.kind.clone(), e.error.clone()))
            .collect::<Vec<_>>()
    };
    for (fence, instead_of, error) in [
        (f[0], "instead of a retry", "boom"),
        (f[1], "instead of a retry", "boom"),
        (f[2], "instead of a dead letter", "bad input"),
    ] {
        let entries = history(fence.id).await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        let (kind, text) = &entries[0];
        assert_eq!(kind, "cancelled");
        for part in ["a cancel was requested", instead_of, error] {
            assert!(text.contains(part), "{text:?} lacks {part:?}");
        }
    }
    assert_eq!(
        history(f[3].id).await,
        vec![("cancelled".to_owned(), "stopped".to_owned())]
    );
    for fence in [f[4], f[5]] {
        let entries = history(fence.id).await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(
            entries[0]
                .1
                .contains("released after a cancel was requested"),
            "{entries:?}"
        );
    }
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());
}
