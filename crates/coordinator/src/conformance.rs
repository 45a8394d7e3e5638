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
use crate::WorkCoordinator;

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
    /// `failed`, `rejected`, `cancelled`, `lease_expired` or `released`.
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
            claim_skips_paused_or_unknown_queues_and_refuses_unregistered_instances,
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

async fn heartbeat(h: &dyn Harness, id: InstanceId) -> RecordHeartbeatOutcome {
    h.coordinator()
        .record_heartbeat(RecordHeartbeatParams {
            instance: id,
            host: "test-host".into(),
            metadata: json!({"pid": 1}),
            stale_after: STALE,
            dead_after: Some(DEAD),
        })
        .await
        .expect("heartbeat")
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

async fn cleanup(h: &dyn Harness, dead_after: Option<Duration>) -> CleanupStaleInstancesOutcome {
    h.coordinator()
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            stale_after: STALE,
            dead_after,
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

/// Paused and unknown queues yield nothing; an unregistered instance is refused.
pub async fn claim_skips_paused_or_unknown_queues_and_refuses_unregistered_instances(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 1).await;
    assert!(claim(h, me, &["nope"], 10).await.items.is_empty());
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
        .coordinator()
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("alive?");
    assert!(alive.alive);
    h.age_heartbeat(me, STALE * 2).await;
    assert!(cleanup(h, Some(DEAD)).await.reaped.is_empty());
}

/// Killing the lock's session releases the lock; the stale instance is then reaped.
pub async fn killing_the_alive_lock_session_releases_the_lock(h: &dyn Harness) {
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
    let alive = c
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("alive?");
    assert!(alive.alive);
}

async fn wait_until_not_alive(h: &dyn Harness, instance: InstanceId) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let alive = h
            .coordinator()
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
