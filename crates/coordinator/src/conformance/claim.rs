//! `claim_work`: the orphan predicate, batch limits and order, schedules, refusals, reclaims and
//! the drain hint.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

/// The orphan predicate as a truth table, through claim_work: an unowned (released) lease is
/// claimable; a lapsed one only once the sweep released it; an expiry of exactly now, a
/// future expiry and a finished item are not.
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
    // Before a sweep: only the released lease; a lapsed one is still its owner's.
    let first = claim(h, c, &["q"], 10).await;
    assert_eq!(
        ids(&first),
        [unowned].into_iter().collect(),
        "unowned (released): claimable; owned with an expiry in the past: not until a sweep \
         releases it"
    );
    let out = h
        .sweep_and_claim_with_lease_expiring_now(exact, claim_params(c, &["q"], 10))
        .await
        .expect("claim");
    let got = ids(&out);
    assert!(
        got.contains(&past),
        "expiry in the past, released by the sweep: claimable"
    );
    assert!(
        !got.contains(&exact),
        "expiry exactly now: not released, not claimable"
    );
    assert!(
        !got.contains(&future),
        "expiry in the future: not claimable"
    );
    assert!(!got.contains(&finished), "finished: not claimable");
    assert_eq!(got.len(), 1);
    assert!(first
        .items
        .iter()
        .chain(&out.items)
        .all(|i| i.reclaimed && i.attempt == 2));
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

/// Reclaiming an expired lease counts an attempt and mints a new token. The lapsed lease is
/// released by the sweep, which records the attempt's end naming its owner; a claim before
/// the sweep leaves it alone, and the reclaim writes no second entry.
pub async fn an_orphan_claim_bumps_the_attempt_and_mints_a_new_token(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    let id = enqueue_n(h, "q", 1).await[0];
    let first = claim_one(h, a, "q").await;
    assert_eq!((first.attempt, first.reclaimed), (1, false));
    h.set_lease_expiry(id, chrono::Duration::seconds(-1)).await;
    assert!(
        claim(h, b, &["q"], 10).await.items.is_empty(),
        "a lapsed lease is not claimable before the sweep releases it"
    );
    assert_eq!(row(h, id).await.instance, Some(a));
    let swept = sweep_lapsed(h).await;
    assert_eq!(
        swept.released,
        vec![QueueCount {
            queue: "q".into(),
            items: 1
        }]
    );
    assert_eq!(swept.ended(), 0);
    let released = row(h, id).await;
    assert_eq!(released.state, WorkState::Running);
    assert!(released.instance.is_none() && !released.has_lease);
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
    assert!(
        r.errors[0].error.contains("stopped renewing"),
        "{:?}",
        r.errors[0]
    );
    assert_eq!(r.errors[0].instance, Some(a.to_string()));
}

/// An orphan with no attempts left becomes a dead letter instead of a claim, and a
/// cancel-requested one ends cancelled; the claim says how many of each, per queue, so that
/// its caller counts and logs them.
pub async fn an_orphan_with_attempts_used_up_becomes_a_dead_letter(h: &dyn Harness) {
    queue(h, "q", 1).await;
    let a = instance(h).await;
    let ids = enqueue_n(h, "q", 2).await;
    let (id, cancelled) = (ids[0], ids[1]);
    assert_eq!(claim(h, a, &["q"], 10).await.items.len(), 2);
    h.request_cancel(cancelled).await;
    // `a` is reaped: its leases are released (orphans).
    h.age_heartbeat(a, STALE * 2).await;
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
    let a = instance(h).await;
    let out = claim(h, a, &["q"], 10).await;
    assert!(out.items.is_empty());
    assert_eq!(
        out.orphans_ended,
        DeadLetterExpiredOutcome {
            released: vec![],
            dead: vec![QueueCount {
                queue: "q".into(),
                items: 1
            }],
            cancelled: vec![QueueCount {
                queue: "q".into(),
                items: 1
            }],
        }
    );
    assert!(!out.has_more);
    assert_eq!(row(h, cancelled).await.state, WorkState::Cancelled);
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

/// A claim reports each item's pickup lag: how long it waited from being due (its enqueue,
/// its retry time, its schedule) to the claim, on the store's clock; a reclaimed orphan
/// reports none (its wait measures its dead owner, not the queue).
pub async fn a_claim_reports_the_pickup_lag_from_due_to_claim_except_for_reclaims(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let fresh = enqueue_n(h, "q", 1).await[0];
    let overdue = enqueue(
        h,
        vec![NewWork::new("q", json!("due")).run_after(Duration::from_secs(3600))],
    )
    .await[0];
    // Due 90 s ago by the store's clock: promoted and claimed by the same call.
    h.set_run_at(overdue, chrono::Duration::seconds(-90)).await;
    let out = claim(h, me, &["q"], 10).await;
    assert_eq!(ids(&out), HashSet::from([fresh, overdue]));
    let lag = |id: WorkId| {
        out.items
            .iter()
            .find(|c| c.fence.id == id)
            .and_then(|c| c.pickup_lag)
            .unwrap_or_else(|| panic!("item {id} claimed fresh reports a pickup lag"))
    };
    assert!(
        lag(fresh) < Duration::from_secs(30),
        "enqueued just now: {:?}",
        lag(fresh)
    );
    assert!(
        (Duration::from_secs(90)..Duration::from_secs(120)).contains(&lag(overdue)),
        "due 90 s before the claim: {:?}",
        lag(overdue)
    );

    h.set_lease_expiry(fresh, chrono::Duration::seconds(-1))
        .await;
    sweep_lapsed(h).await;
    let other = instance(h).await;
    let reclaim = claim(h, other, &["q"], 10).await;
    assert_eq!(ids(&reclaim), HashSet::from([fresh]));
    assert!(reclaim.items[0].reclaimed);
    assert_eq!(
        reclaim.items[0].pickup_lag, None,
        "a reclaim has no pickup lag"
    );
}

/// A lapsed lease is its owner's until the sweep releases it: no claim takes it, its renewal
/// is refused, and an outcome it writes lands. The sweep's release fences the owner out and
/// wakes the queue's claimers; an exactly-expiring lease is not released.
pub async fn a_lapsed_lease_is_its_owners_until_the_sweep_releases_it(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let owner = instance(h).await;
    let peer = instance(h).await;
    enqueue_n(h, "q", 3).await;
    let held = claim(h, owner, &["q"], 3).await;
    let fences: Vec<Fence> = held.items.iter().map(|c| c.fence).collect();
    let (landed, released, kept) = (fences[0], fences[1], fences[2]);
    for f in [landed, released] {
        h.set_lease_expiry(f.id, chrono::Duration::seconds(-1))
            .await;
    }
    assert!(claim(h, peer, &["q"], 10).await.items.is_empty());
    let renewed = renew(h, owner, vec![landed, kept]).await;
    assert_eq!(
        renewed.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![RenewalStatus::Lost, RenewalStatus::Renewed],
        "a lapsed lease is not renewed"
    );
    assert!(!complete(h, owner, vec![landed]).await.items[0].fenced_out());
    assert_eq!(row(h, landed.id).await.state, WorkState::Completed);

    let mut listener = h
        .coordinator()
        .listen(ListenParams::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("event"),
        ListenEvent::Connected
    );
    let swept = sweep_lapsed(h).await;
    assert_eq!(swept.released(), 1, "{swept:?}");
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("a wake signal in time")
        .expect("event");
    assert_eq!(woken, ListenEvent::Wake { queue: "q".into() });
    assert!(complete(h, owner, vec![released]).await.items[0].fenced_out());
    let r = row(h, released.id).await;
    assert_eq!((r.state, r.instance), (WorkState::Running, None));
    assert_eq!(row(h, kept.id).await.instance, Some(owner));
    let taken = claim(h, peer, &["q"], 10).await;
    assert_eq!(ids(&taken), [released.id].into_iter().collect());
    assert!(taken.items[0].reclaimed);
    assert_eq!(sweep_lapsed(h).await, DeadLetterExpiredOutcome::default());
}
