//! The fenced outcomes: `complete_work`, `fail_work`, `release_work`, `checkpoint_work`.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

/// After a reclaim, the old claim's complete, fail, release and checkpoint change nothing.
pub async fn a_zombies_outcomes_after_a_reclaim_are_fenced_out(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let zombie = instance(h).await;
    let peer = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let old = claim_one(h, zombie, "q").await.fence;
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    sweep_lapsed(h).await;
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
    sweep_lapsed(h).await;
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
