//! The operator's calls ([`crate::Operations`]): `cancel_work`, `retry_dead_work`, `discard_work`.

use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::types::*;

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
