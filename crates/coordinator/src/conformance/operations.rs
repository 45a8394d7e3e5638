//! The operator's calls ([`crate::Operations`]): `cancel_work`, `retry_dead_work`, `discard_work`.

use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::ops_types::*;
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

/// A paused queue hands out nothing (its running items still finish); resuming makes it
/// claimable again and wakes its claimers. An unknown queue is refused.
pub async fn a_paused_queue_hands_out_nothing_until_resumed_and_resuming_wakes_its_claimers(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let running = claim_one(h, me, "q").await.fence;
    let ops = h.operations();
    let pause = |q: &str| ops.pause_queue(PauseQueueParams { queue: q.into() });
    assert!(pause("q").await.expect("pause").changed);
    assert!(
        !pause("q").await.expect("pause again").changed,
        "already paused"
    );
    assert!(
        claim(h, me, &["q"], 10).await.items.is_empty(),
        "nothing is handed out"
    );
    assert_eq!(
        complete(h, me, vec![running]).await.items[0].state,
        Some(WorkState::Completed),
        "a running item finishes"
    );
    let overview = ops
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview");
    let q = overview.get("q").expect("q");
    assert_eq!((q.paused, q.available), (true, 1));

    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("listen"),
        ListenEvent::Connected
    );
    let resume = |q: &str| ops.resume_queue(ResumeQueueParams { queue: q.into() });
    assert!(resume("q").await.expect("resume").changed);
    assert_eq!(next_wake(&mut listener).await, "q");
    assert!(!resume("q").await.expect("resume again").changed);
    assert_eq!(claim(h, me, &["q"], 10).await.items.len(), 1);

    for err in [
        pause("nope").await.unwrap_err(),
        resume("nope").await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, crate::Error::UnknownQueue(q) if q == "nope"),
            "{err}"
        );
    }
}

/// By ids: each item is acted on whole or refused with its state and why; unknown ids are
/// named; a repeated id is answered once; too many ids are refused before anything changes.
pub async fn bulk_work_by_ids_applies_each_item_whole_and_says_why_others_were_refused(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ops = h.operations();
    let bulk = |action, ids: Vec<WorkId>| ops.bulk_work(BulkWorkParams { action, ids });
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(1)).unique_key("k"),
            NewWork::new("q", json!(2)),
            NewWork::new("q", json!(3)),
            NewWork::new("q", json!(4)),
        ],
    )
    .await;
    let keyed = claim_one(h, me, "q").await.fence;
    fail(h, me, keyed, "x", FailDisposition::DeadLetter).await;
    let dead = claim_one(h, me, "q").await.fence;
    fail(h, me, dead, "x", FailDisposition::DeadLetter).await;
    let running = claim_one(h, me, "q").await.fence;
    let waiting = ids[3];
    // The key of the first dead letter is taken by a newer item.
    let holder = enqueue(h, vec![NewWork::new("q", json!(5)).unique_key("k")]).await[0];
    let unknown = 987_654_321;

    // retry
    let before_refused: Vec<_> = [keyed.id, running.id, waiting]
        .iter()
        .map(|id| h.work_row(*id))
        .collect();
    let mut rows = Vec::new();
    for r in before_refused {
        rows.push(r.await);
    }
    let out = bulk(
        BulkAction::Retry,
        vec![dead.id, keyed.id, running.id, unknown, waiting, dead.id],
    )
    .await
    .expect("bulk retry");
    let got: Vec<(WorkId, Option<WorkState>, bool)> = out
        .items
        .iter()
        .map(|i| (i.id, i.state_before, i.result.applied()))
        .collect();
    assert_eq!(
        got,
        vec![
            (dead.id, Some(WorkState::Dead), true),
            (keyed.id, Some(WorkState::Dead), false),
            (running.id, Some(WorkState::Running), false),
            (unknown, None, false),
            (waiting, Some(WorkState::Available), false),
        ],
        "one answer per distinct id, in order"
    );
    assert_eq!(out.items[0].result, BulkResult::Retried);
    assert!(
        matches!(&out.items[1].result, BulkResult::Refused { state: WorkState::Dead, reason } if reason.contains("unique key"))
    );
    assert!(
        matches!(&out.items[2].result, BulkResult::Refused { reason, .. } if reason.contains("dead letter"))
    );
    assert_eq!(out.items[3].result, BulkResult::NotFound);
    for (id, before) in [keyed.id, running.id, waiting].into_iter().zip(rows) {
        assert_eq!(h.work_row(id).await, before, "a refused item is unchanged");
    }
    let r = row(h, dead.id).await;
    assert_eq!((r.state, r.attempt), (WorkState::Available, 0));
    assert_eq!(r.errors.last().map(|e| e.kind.as_str()), Some("retried"));

    // cancel: waiting -> cancelled, running -> requested, finished -> refused.
    let out = bulk(
        BulkAction::Cancel,
        vec![waiting, running.id, holder, keyed.id, unknown],
    )
    .await
    .expect("bulk cancel");
    let results: Vec<&BulkResult> = out.items.iter().map(|i| &i.result).collect();
    assert_eq!(results[0], &BulkResult::Cancelled);
    assert_eq!(results[1], &BulkResult::Requested);
    assert_eq!(results[2], &BulkResult::Cancelled);
    assert!(
        matches!(results[3], BulkResult::Refused { state: WorkState::Dead, reason } if reason.contains("finished"))
    );
    assert_eq!(results[4], &BulkResult::NotFound);
    assert_eq!(row(h, waiting).await.state, WorkState::Cancelled);
    let r = row(h, running.id).await;
    assert_eq!((r.state, r.cancel_requested), (WorkState::Running, true));

    // discard: finished -> deleted, unfinished -> refused.
    let out = bulk(
        BulkAction::Discard,
        vec![keyed.id, waiting, running.id, dead.id],
    )
    .await
    .expect("bulk discard");
    let got: Vec<bool> = out.items.iter().map(|i| i.result.applied()).collect();
    assert_eq!(got, vec![true, true, false, false]);
    assert_eq!(h.work_row(keyed.id).await, None);
    assert_eq!(h.work_row(waiting).await, None);
    assert_eq!(row(h, running.id).await.state, WorkState::Running);
    assert_eq!(row(h, dead.id).await.state, WorkState::Available);

    // Too many ids: refused whole.
    let count = h.work_count().await;
    let err = bulk(
        BulkAction::Discard,
        (1..=MAX_BULK_BATCH as i64 + 1).collect(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, crate::Error::InvalidArgument(m) if m.contains("at most")),
        "{err}"
    );
    assert_eq!(h.work_count().await, count);
    assert!(bulk(BulkAction::Retry, vec![])
        .await
        .expect("empty")
        .items
        .is_empty());
}

/// By filter: at most `limit` items a call, lowest ids first, with a has_more that ends; an
/// empty filter is refused unless `all`; items the action cannot apply to are left alone.
pub async fn bulk_work_matching_acts_in_bounded_batches_and_refuses_an_empty_filter(
    h: &dyn Harness,
) {
    queue(h, "q1", 10).await;
    queue(h, "q2", 10).await;
    let me = instance(h).await;
    let ops = h.operations();
    let mut dead_q1 = Vec::new();
    enqueue_n(h, "q1", 5).await;
    for _ in 0..5 {
        let f = claim_one(h, me, "q1").await.fence;
        fail(h, me, f, "boom", FailDisposition::DeadLetter).await;
        dead_q1.push(f.id);
    }
    enqueue_n(h, "q2", 2).await;
    let mut dead_q2 = Vec::new();
    for _ in 0..2 {
        let f = claim_one(h, me, "q2").await.fence;
        fail(h, me, f, "boom", FailDisposition::DeadLetter).await;
        dead_q2.push(f.id);
    }
    let waiting_q1 = enqueue_n(h, "q1", 1).await[0];
    assert_eq!(
        dead_q1.len() + dead_q2.len(),
        7,
        "the dead letters the calls act on"
    );

    // An empty filter, without all: refused, nothing changed.
    let before: Vec<_> = {
        let mut v = Vec::new();
        for id in dead_q1.iter().chain(&dead_q2) {
            v.push(row(h, *id).await);
        }
        v
    };
    for action in [BulkAction::Retry, BulkAction::Cancel, BulkAction::Discard] {
        let err = ops
            .bulk_work_matching(BulkWorkMatchingParams::new(action, WorkFilter::new()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, crate::Error::InvalidArgument(m) if m.contains("empty filter")),
            "{err}"
        );
        let err = ops
            .bulk_work_matching_all(BulkWorkMatchingParams::new(action, WorkFilter::new()))
            .await
            .unwrap_err();
        assert!(matches!(&err, crate::Error::InvalidArgument(_)), "{err}");
    }
    let mut params = BulkWorkMatchingParams::new(BulkAction::Retry, WorkFilter::new().queue("q1"));
    for limit in [0, MAX_BULK_BATCH + 1] {
        params.limit = limit;
        let err = ops.bulk_work_matching(params.clone()).await.unwrap_err();
        assert!(
            matches!(&err, crate::Error::InvalidArgument(m) if m.contains("limit")),
            "{err}"
        );
    }
    for (id, was) in dead_q1.iter().chain(&dead_q2).zip(before) {
        assert_eq!(row(h, *id).await, was, "nothing changed");
    }

    // Retry q1's dead letters two at a time.
    params.limit = 2;
    let mut retried = Vec::new();
    let mut calls = 0;
    loop {
        let out = ops.bulk_work_matching(params.clone()).await.expect("batch");
        calls += 1;
        assert!(out.items.len() <= 2);
        assert!(out.items.iter().all(|i| i.result == BulkResult::Retried));
        retried.extend(out.items.iter().map(|i| i.id));
        if !out.has_more {
            break;
        }
        assert!(calls < 10, "has_more never ends");
    }
    assert_eq!(calls, 3);
    assert_eq!(retried, dead_q1, "lowest ids first, each once");
    for id in &dead_q2 {
        assert_eq!(
            row(h, *id).await.state,
            WorkState::Dead,
            "another queue is left alone"
        );
    }
    assert_eq!(row(h, waiting_q1).await.state, WorkState::Available);

    // Cancel everything waiting, with all; then discard every cancelled item in one go.
    let mut all = BulkWorkMatchingParams::new(BulkAction::Cancel, WorkFilter::new());
    all.all = true;
    let totals = ops.bulk_work_matching_all(all).await.expect("cancel all");
    assert_eq!(
        (totals.applied, totals.refused),
        (6, 0),
        "five retried, one waiting"
    );
    let totals = ops
        .bulk_work_matching_all(BulkWorkMatchingParams::new(
            BulkAction::Discard,
            WorkFilter::new().state(WorkState::Cancelled),
        ))
        .await
        .expect("discard cancelled");
    assert_eq!((totals.applied, totals.batches), (6, 1));
    assert_eq!(h.work_count().await, 2, "q2's dead letters are left");
}

/// A bulk discard takes completed items and dead letters alike (the store keeps them in
/// different tables), the lowest ids first across both, in bounded batches, and leaves
/// unfinished items; a filter on the completed state takes only those.
pub async fn bulk_discard_takes_completed_and_dead_items_lowest_ids_first(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ops = h.operations();
    let ids = enqueue_n(h, "q", 8).await;
    let claimed = claim(h, me, &["q"], 8).await.items;
    assert_eq!(claimed.len(), 8);
    let fence = |id: WorkId| {
        claimed
            .iter()
            .find(|i| i.fence.id == id)
            .expect("claimed")
            .fence
    };
    // Alternately completed and dead-lettered; the last one keeps running.
    let outcome = complete(h, me, [0, 2, 4, 6].map(|i| fence(ids[i])).to_vec()).await;
    assert!(outcome.all_recorded().is_ok());
    for i in [1, 3, 5] {
        fail(h, me, fence(ids[i]), "boom", FailDisposition::DeadLetter).await;
    }

    let completed_only = ops
        .bulk_work_matching(BulkWorkMatchingParams {
            limit: 1,
            ..BulkWorkMatchingParams::new(
                BulkAction::Discard,
                WorkFilter::new().state(WorkState::Completed),
            )
        })
        .await
        .expect("discard one completed item");
    assert_eq!(
        completed_only
            .items
            .iter()
            .map(|i| (i.id, i.result.clone()))
            .collect::<Vec<_>>(),
        vec![(ids[0], BulkResult::Discarded)]
    );
    assert!(completed_only.has_more);

    let mut params = BulkWorkMatchingParams::new(BulkAction::Discard, WorkFilter::new().queue("q"));
    params.limit = 2;
    let (mut discarded, mut calls) = (Vec::new(), 0);
    loop {
        let out = ops.bulk_work_matching(params.clone()).await.expect("batch");
        calls += 1;
        assert!(out.items.len() <= 2, "{out:?}");
        assert!(out.items.iter().all(|i| i.result == BulkResult::Discarded));
        discarded.extend(out.items.iter().map(|i| (i.id, i.state_before)));
        if !out.has_more {
            break;
        }
        assert!(calls < 10, "has_more never ends");
    }
    assert_eq!(calls, 3);
    assert_eq!(
        discarded,
        (1..7)
            .map(|i| (
                ids[i],
                if i % 2 == 0 {
                    Some(WorkState::Completed)
                } else {
                    Some(WorkState::Dead)
                }
            ))
            .collect::<Vec<_>>(),
        "lowest ids first across completed and dead items, each once"
    );
    for id in &ids[..7] {
        assert!(h.work_row(*id).await.is_none(), "item {id} is discarded");
    }
    assert_eq!(row(h, ids[7]).await.state, WorkState::Running);
    assert_eq!(h.work_count().await, 1);
}

/// A bulk action by kind acts on the items of that kind only, in a queue shared with other
/// kinds and untyped items; a kind alone is a filter (no `all` needed).
pub async fn bulk_work_matching_by_kind_acts_only_on_items_of_those_kinds(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ops = h.operations();
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(1)).kind("a"),
            NewWork::new("q", json!(2)).kind("b"),
            NewWork::new("q", json!(3)).kind("a"),
            NewWork::new("q", json!(4)).kind("b"),
            NewWork::new("q", json!(5)),
        ],
    )
    .await;
    let (kind_a, kind_b, untyped) = (vec![ids[0], ids[2]], vec![ids[1], ids[3]], ids[4]);
    for claimed in claim(h, me, &["q"], 5).await.items {
        fail(h, me, claimed.fence, "boom", FailDisposition::DeadLetter).await;
    }
    for id in &ids {
        assert_eq!(row(h, *id).await.state, WorkState::Dead);
    }
    let by_kind = |action, kinds: &[&str]| {
        let mut filter = WorkFilter::new();
        for k in kinds {
            filter = filter.kind(*k);
        }
        BulkWorkMatchingParams::new(action, filter)
    };

    let out = ops
        .bulk_work_matching(by_kind(BulkAction::Retry, &["a"]))
        .await
        .expect("retry kind a");
    let mut retried: Vec<WorkId> = out.items.iter().map(|i| i.id).collect();
    retried.sort_unstable();
    assert_eq!(retried, kind_a, "only kind a's dead letters");
    assert!(out.items.iter().all(|i| i.result == BulkResult::Retried));
    for id in kind_b.iter().chain([&untyped]) {
        assert_eq!(row(h, *id).await.state, WorkState::Dead, "item {id}");
    }

    // Cancel kinds a and b: only a's items are waiting; b's dead letters cannot be cancelled.
    let totals = ops
        .bulk_work_matching_all(by_kind(BulkAction::Cancel, &["a", "b"]))
        .await
        .expect("cancel kinds a and b");
    assert_eq!((totals.applied, totals.refused), (2, 0));
    for id in &kind_a {
        assert_eq!(row(h, *id).await.state, WorkState::Cancelled);
    }

    let totals = ops
        .bulk_work_matching_all(by_kind(BulkAction::Discard, &["b"]))
        .await
        .expect("discard kind b");
    assert_eq!(totals.applied, 2);
    for id in &kind_b {
        assert!(h.work_row(*id).await.is_none(), "item {id} is discarded");
    }
    assert_eq!(
        h.work_count().await,
        3,
        "kind a's two and the untyped item remain"
    );
    assert_eq!(row(h, untyped).await.state, WorkState::Dead);
}

/// The first service to declare a queue owns its settings: another service's (or an
/// anonymous) declaration does not change them and learns whose they are; the owner changes
/// its own; an operator changes them or hands them over.
pub async fn queue_settings_have_one_owner_and_an_operator_may_change_or_hand_them_over(
    h: &dyn Harness,
) {
    let c = h.coordinator();
    let ops = h.operations();
    let declare = |name: &str, max_attempts: i32, owner: Option<&str>| {
        c.register_queue(RegisterQueueParams {
            ordering_dead_head: Default::default(),
            max_running: None,
            rate_limit: None,
            name: name.into(),
            max_attempts,
            owner: owner.map(str::to_owned),
        })
    };
    let settings = |applied: bool, owner: Option<&str>, max_attempts: i32| RegisterQueueOutcome {
        ordering_dead_head: Default::default(),
        max_running: None,
        rate_limit: None,
        applied,
        owner: owner.map(str::to_owned),
        max_attempts,
    };
    let stored = |name: &'static str| {
        let ops = ops.clone();
        async move {
            let overview = ops
                .queue_overview(QueueOverviewParams {})
                .await
                .expect("overview");
            let q = overview.get(name).expect("listed");
            (q.owner.clone(), q.max_attempts)
        }
    };
    let billing = Some("billing");
    let shipping = Some("shipping");

    assert_eq!(
        declare("q", 5, billing).await.expect("first"),
        settings(true, billing, 5)
    );
    assert_eq!(
        declare("q", 7, billing).await.expect("own"),
        settings(true, billing, 7)
    );
    assert_eq!(
        declare("q", 3, shipping).await.expect("another's"),
        settings(false, billing, 7),
        "another service's settings are not applied, and it learns whose stay"
    );
    assert_eq!(
        declare("q", 7, shipping).await.expect("same"),
        settings(true, billing, 7)
    );
    assert_eq!(
        declare("q", 2, None).await.expect("anonymous"),
        settings(false, billing, 7)
    );
    assert_eq!(stored("q").await, (Some("billing".into()), Some(7)));

    // An anonymous declaration creates a queue nobody owns; the first named one adopts it.
    assert_eq!(
        declare("p", 4, None).await.expect("anonymous"),
        settings(true, None, 4)
    );
    assert_eq!(
        declare("p", 9, None).await.expect("anonymous"),
        settings(false, None, 4)
    );
    assert_eq!(
        declare("p", 6, shipping).await.expect("adopt"),
        settings(true, shipping, 6)
    );

    // The operator hands q to shipping with new settings, then to nobody.
    let set = |max_attempts, owner: Option<Option<&str>>| {
        ops.set_queue_settings(SetQueueSettingsParams {
            ordering_dead_head: None,
            max_running: None,
            rate_limit: None,
            queue: "q".into(),
            max_attempts,
            owner: owner.map(|o| o.map(str::to_owned)),
        })
    };
    let out = set(Some(9), Some(shipping)).await.expect("hand over");
    assert_eq!((out.owner.as_deref(), out.max_attempts), (shipping, 9));
    assert_eq!(
        declare("q", 5, billing).await.expect("old owner"),
        settings(false, shipping, 9)
    );
    let out = set(None, None).await.expect("keep both");
    assert_eq!((out.owner.as_deref(), out.max_attempts), (shipping, 9));
    let out = set(None, Some(None)).await.expect("release");
    assert_eq!((out.owner, out.max_attempts), (None, 9));
    assert_eq!(
        declare("q", 5, billing).await.expect("adopt"),
        settings(true, billing, 5)
    );
    assert_eq!(stored("q").await, (Some("billing".into()), Some(5)));

    // Bad input: refused, nothing changed.
    let err = ops
        .set_queue_settings(SetQueueSettingsParams {
            ordering_dead_head: None,
            max_running: None,
            rate_limit: None,
            queue: "nope".into(),
            max_attempts: Some(3),
            owner: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, crate::Error::UnknownQueue(q) if q == "nope"),
        "{err}"
    );
    for err in [
        set(Some(0), None).await.unwrap_err(),
        set(None, Some(Some(""))).await.unwrap_err(),
        declare("q", 5, Some("")).await.unwrap_err(),
    ] {
        assert!(matches!(err, crate::Error::InvalidArgument(_)), "{err}");
    }
    assert_eq!(stored("q").await, (Some("billing".into()), Some(5)));
}

/// `run_now`: scheduled items (delayed ones and retries in their backoff) become available and
/// due at once, keeping their attempts and history, and their claimers are woken; any other
/// state is refused and unchanged; by filter it picks only scheduled items.
pub async fn run_now_makes_scheduled_items_due_at_once_and_refuses_others(h: &dyn Harness) {
    queue(h, "q", 10).await;
    queue(h, "other", 10).await;
    let me = instance(h).await;
    let later = enqueue_later(h, "q", 2).await;
    let elsewhere = enqueue_later(h, "other", 1).await[0];
    enqueue_n(h, "q", 2).await;
    let claimed = claim(h, me, &["q"], 10).await;
    // Both available items are claimed: one fails into its backoff, the other keeps running.
    let (retry, running) = (claimed.items[0].fence, claimed.items[1].fence);
    assert_eq!(
        fail(h, me, retry, "boom", FailDisposition::RetryAfter(HOUR)).await,
        Some(WorkState::Scheduled)
    );
    let ops = h.operations();
    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("listen"),
        ListenEvent::Connected
    );

    let out = ops
        .bulk_work(BulkWorkParams {
            action: BulkAction::RunNow,
            ids: vec![later[0], retry.id, running.id],
        })
        .await
        .expect("run_now by ids");
    assert_eq!(out.items[0].result, BulkResult::Promoted);
    assert_eq!(out.items[1].result, BulkResult::Promoted);
    assert!(
        matches!(&out.items[2].result, BulkResult::Refused { state: WorkState::Running, reason } if reason.contains("scheduled")),
        "{:?}",
        out.items[2]
    );
    assert_eq!(next_wake(&mut listener).await, "q");
    assert_eq!(row(h, running.id).await.state, WorkState::Running);
    // Due now: claimable at once, the retry as its next attempt with its history kept.
    let again = claim(h, me, &["q"], 10).await;
    let mut got: Vec<(WorkId, i32)> = again
        .items
        .iter()
        .map(|c| (c.fence.id, c.attempt))
        .collect();
    got.sort();
    let mut want = vec![(later[0], 1), (retry.id, 2)];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(row(h, retry.id).await.errors.len(), 1);
    assert_eq!(row(h, later[1]).await.state, WorkState::Scheduled);

    // By filter: only the scheduled items the filter matches.
    let out = ops
        .bulk_work_matching(BulkWorkMatchingParams::new(
            BulkAction::RunNow,
            WorkFilter::new().queue("q"),
        ))
        .await
        .expect("run_now by filter");
    let ids: Vec<(WorkId, BulkResult)> = out.items.into_iter().map(|i| (i.id, i.result)).collect();
    assert_eq!(ids, vec![(later[1], BulkResult::Promoted)]);
    assert!(!out.has_more);
    assert_eq!(row(h, later[1]).await.state, WorkState::Available);
    assert_eq!(row(h, elsewhere).await.state, WorkState::Scheduled);
}
