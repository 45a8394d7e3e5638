//! `fire_periodic`: one item per fire time across every caller, fire times only forward, the
//! store's clock deciding what is due, a changed definition, and refusals.

use chrono::{DateTime, Duration as Delta, Utc};
use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::periodic::*;
use crate::types::*;

async fn fire(
    h: &dyn Harness,
    name: &str,
    fingerprint: &str,
    fire_at: DateTime<Utc>,
    next_fire_at: Option<DateTime<Utc>>,
    work: NewWork,
) -> crate::Result<FirePeriodicOutcome> {
    h.coordinator()
        .fire_periodic(FirePeriodicParams {
            name: name.into(),
            fingerprint: fingerprint.into(),
            fire: Some(PeriodicFire {
                fire_at,
                next_fire_at,
                work,
            }),
        })
        .await
}

async fn state(h: &dyn Harness, name: &str) -> FirePeriodicOutcome {
    let out = h
        .coordinator()
        .fire_periodic(FirePeriodicParams {
            name: name.into(),
            fingerprint: "every 10 s".into(),
            fire: None,
        })
        .await
        .expect("read the schedule's state");
    assert_eq!(out.result, FireResult::State);
    out
}

fn fired(out: &FirePeriodicOutcome) -> Enqueued {
    match out.result {
        FireResult::Fired(e) => e,
        other => panic!("expected a claimed fire time, got {other:?} ({out:?})"),
    }
}

/// Eight callers race for one fire time: one claims it and enqueues the template as given,
/// the others are told it was already fired, and the store holds one item.
pub async fn concurrent_callers_enqueue_one_item_per_fire_time(h: &dyn Harness) {
    queue(h, "reports", 10).await;
    let now = state(h, "nightly").await.db_now;
    assert_eq!(state(h, "nightly").await.last_fire_at, None);
    let fire_at = now - Delta::seconds(1);
    let template = NewWork::new("reports", json!({"report": "daily"}))
        .priority(3)
        .max_attempts(4);
    let calls = (0..8).map(|_| {
        fire(
            h,
            "nightly",
            "every 10 s",
            fire_at,
            Some(fire_at + Delta::seconds(10)),
            template.clone(),
        )
    });
    let outs: Vec<FirePeriodicOutcome> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("fire_periodic"))
        .collect();
    let winners: Vec<Enqueued> = outs
        .iter()
        .filter_map(|o| match o.result {
            FireResult::Fired(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{outs:?}");
    assert!(winners[0].inserted);
    assert_eq!(
        outs.iter()
            .filter(|o| o.result == FireResult::AlreadyFired)
            .count(),
        7,
        "{outs:?}"
    );
    for o in &outs {
        assert_eq!(o.last_fire_at, Some(fire_at), "{o:?}");
    }
    assert_eq!(h.work_count().await, 1);
    let item = row(h, winners[0].id).await;
    assert_eq!(item.queue, "reports");
    assert_eq!(item.payload, json!({"report": "daily"}));
    assert_eq!(item.priority, 3);
    assert_eq!(item.max_attempts, 4);
    let after = state(h, "nightly").await;
    assert_eq!(after.last_fire_at, Some(fire_at));
    assert_eq!(after.fingerprint.as_deref(), Some("every 10 s"));
}

/// Fire times move forward only: a later one after an earlier one is claimed, an earlier or
/// equal one is refused (already fired), even after the first item completed — the claim,
/// not the unique key, is what keeps a fire time from running twice.
pub async fn fire_times_are_claimed_forward_only_even_after_the_item_completed(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let now = state(h, "s").await.db_now;
    let (t1, t2) = (now - Delta::seconds(20), now - Delta::seconds(10));
    // The next fire times the caller passes lie ahead, so neither is overtaken.
    let ahead = Some(now + Delta::minutes(10));
    let work = NewWork::new("q", json!(1)).unique_key("tick");
    let first = fired(
        &fire(h, "s", "every 10 s", t1, ahead, work.clone())
            .await
            .expect("first"),
    );
    // The item runs and completes at once: its unique key no longer guards anything.
    let claimed = claim_one(h, me, "q").await;
    assert_eq!(claimed.fence.id, first.id);
    complete(h, me, vec![claimed.fence])
        .await
        .all_recorded()
        .expect("complete");
    let again = fire(h, "s", "every 10 s", t1, ahead, work.clone())
        .await
        .expect("again");
    assert_eq!(again.result, FireResult::AlreadyFired);
    assert_eq!(again.last_fire_at, Some(t1));
    assert_eq!(h.work_count().await, 1, "the completed fire time ran once");

    let second = fired(
        &fire(h, "s", "every 10 s", t2, ahead, work.clone())
            .await
            .expect("second"),
    );
    assert_ne!(second.id, first.id);
    let earlier = fire(h, "s", "every 10 s", t1, ahead, work)
        .await
        .expect("earlier");
    assert_eq!(earlier.result, FireResult::AlreadyFired);
    assert_eq!(earlier.last_fire_at, Some(t2));
    assert_eq!(h.work_count().await, 2);
}

/// The store's clock decides: a fire time it has not reached yet is not due, and one whose
/// next fire time it reached too was missed (overtaken); neither claims or enqueues.
pub async fn a_fire_time_not_yet_due_or_overtaken_claims_nothing(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let now = state(h, "s").await.db_now;
    let work = NewWork::new("q", json!(1));
    let ahead = now + Delta::hours(1);
    let out = fire(
        h,
        "s",
        "hourly",
        ahead,
        Some(ahead + Delta::hours(1)),
        work.clone(),
    )
    .await
    .expect("not due");
    assert_eq!(out.result, FireResult::NotDue);
    assert!(out.db_now < ahead);
    let missed = now - Delta::hours(2);
    let out = fire(
        h,
        "s",
        "hourly",
        missed,
        Some(now - Delta::hours(1)),
        work.clone(),
    )
    .await
    .expect("overtaken");
    assert_eq!(out.result, FireResult::Overtaken);
    assert_eq!(out.last_fire_at, None);
    assert_eq!(h.work_count().await, 0);
    // Without a next fire time nothing can overtake it.
    let out = fire(h, "s", "once", missed, None, work)
        .await
        .expect("last");
    fired(&out);
    assert_eq!(h.work_count().await, 1);
}

/// A changed definition (another fingerprint) claims fire times later than the last one,
/// whoever claimed it, and is recorded with them; an older definition's fire time that is
/// not later is refused, so two definitions running side by side never enqueue one instant
/// twice.
pub async fn a_changed_definition_claims_only_later_fire_times_and_is_recorded(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let now = state(h, "s").await.db_now;
    let work = NewWork::new("q", json!("x"));
    let old_t = now - Delta::seconds(30);
    fired(
        &fire(
            h,
            "s",
            "every 30 s",
            old_t,
            Some(now + Delta::minutes(10)),
            work.clone(),
        )
        .await
        .expect("old definition"),
    );
    let new_t = now - Delta::seconds(5);
    let out = fire(
        h,
        "s",
        "every 5 s",
        new_t,
        Some(now + Delta::minutes(10)),
        work.clone(),
    )
    .await
    .expect("new definition");
    fired(&out);
    assert_eq!(out.fingerprint.as_deref(), Some("every 5 s"));
    // The old definition comes back with a fire time between the two: refused.
    let out = fire(h, "s", "every 30 s", now - Delta::seconds(10), None, work)
        .await
        .expect("old again");
    assert_eq!(out.result, FireResult::AlreadyFired);
    assert_eq!(out.last_fire_at, Some(new_t));
    assert_eq!(out.fingerprint.as_deref(), Some("every 5 s"));
    assert_eq!(h.work_count().await, 2);
}

/// Bad arguments are refused naming the problem; an item the store refuses (an unknown
/// queue) leaves the fire time unclaimed, so nothing at all was written.
pub async fn fire_periodic_refuses_bad_arguments_and_an_unknown_queue_leaves_it_unclaimed(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let now = state(h, "s").await.db_now;
    let t = now - Delta::seconds(1);
    let work = NewWork::new("q", json!(1));
    let err = fire(h, "", "fp", t, None, work.clone()).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("name")),
        "{err}"
    );
    let err = fire(h, "s", "", t, None, work.clone()).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("fingerprint")),
        "{err}"
    );
    let err = fire(h, "s", "fp", t, Some(t), work.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("next_fire_at")),
        "{err}"
    );
    let err = fire(h, "s", "fp", t, None, NewWork::new("nope", json!(1)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "nope"),
        "{err}"
    );
    let after = state(h, "s").await;
    assert_eq!(
        after.last_fire_at, None,
        "the claim rolled back with the enqueue"
    );
    assert_eq!(h.work_count().await, 0);
    // The same fire time can still be claimed once the item is right.
    fired(&fire(h, "s", "fp", t, None, work).await.expect("retry"));
}
