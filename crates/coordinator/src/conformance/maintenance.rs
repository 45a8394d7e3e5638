//! The maintenance steps: `maintenance_due`, `promote_scheduled`, `dead_letter_expired`,
//! `prune_finished`, `prune_evicted_instances`, `queue_depth`, `server_status`, `vacuum_work`.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

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

/// The probe's arguments the cases below use: completed items kept an hour, the rest two;
/// the fleet looks for lapsed leases at most once an hour (a test's calls: the first look).
fn due_params(judge: Option<InstanceId>) -> MaintenanceDueParams {
    MaintenanceDueParams {
        judge,
        stale_after: STALE,
        dead_after: Some(DEAD),
        lock_grace: Some(GRACE),
        completed_retention: Duration::from_secs(3600),
        dead_retention: Duration::from_secs(7200),
        evicted_retention: Duration::from_secs(7200),
        lapsed_look_every: Duration::from_secs(3600),
    }
}

/// The one-statement probe behind an idle sweep: each flag turns on with its kind of work.
pub async fn maintenance_due_flags_exactly_the_steps_that_have_work(h: &dyn Harness) {
    let params = due_params(Some(judge(h).await));
    let due = || async { h.coordinator().maintenance_due(params).await.expect("due") };
    // A store swept once at these retentions: PostgreSQL's first prune attaches the history's
    // partitions (until then it is due); the fake has none to attach.
    h.coordinator()
        .prune_finished(PruneFinishedParams {
            completed_retention: params.completed_retention,
            dead_retention: params.dead_retention,
            limit: 100,
        })
        .await
        .expect("a first sweep's prune");
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
            vacuum: false,
        }
    );
    assert_eq!(cleanup(h, Some(DEAD)).await.reaped.len(), 1);
    h.age_eviction(peer, Duration::from_secs(7201)).await;
    assert!(due().await.tombstones);
    assert!(!due().await.instances);
}

/// The look for lapsed leases visits every running row, so the fleet takes it in turns: a
/// call looks only when no look within `lapsed_look_every`, its own instance's or a peer's,
/// found none, and a call off its turn reports only the other orphans. A look that finds a
/// lapsed lease leaves the turn free, so every call looks until it is released. A store with
/// nothing leased is not looked at, so an idle fleet's calls take no turn.
pub async fn the_fleet_looks_for_lapsed_leases_in_turns(h: &dyn Harness) {
    let every = Duration::from_secs(3600);
    let due_every = |judge: InstanceId, lapsed_look_every: Duration| async move {
        h.coordinator()
            .maintenance_due(MaintenanceDueParams {
                judge: Some(judge),
                lapsed_look_every,
                ..due_params(None)
            })
            .await
            .expect("due")
            .orphans
    };
    let due = |judge| due_every(judge, every);
    queue(h, "q", 3).await;
    let (a, b) = (instance(h).await, instance(h).await);
    // Nothing leased: no call looks, so none takes the turn.
    assert!(!due(a).await);
    let ids = enqueue(
        h,
        vec![NewWork::new("q", json!(1)), NewWork::new("q", json!(2))],
    )
    .await;
    claim(h, a, &["q"], 2).await;
    assert!(
        !due(b).await,
        "the first call with leases held looks and finds none"
    );
    h.set_lease_expiry(ids[0], chrono::Duration::seconds(-1))
        .await;
    assert!(
        !due(a).await,
        "a peer's look within the hour found none: no look"
    );
    assert!(!due(b).await, "nor does the one that looked");

    // The turn comes round again once the last look is older than `lapsed_look_every`.
    h.age_lapsed_look(every - Duration::from_secs(60)).await;
    assert!(!due(a).await, "a look 59 minutes ago still counts");
    h.age_lapsed_look(Duration::from_secs(120)).await;
    assert!(
        due(a).await,
        "one an hour ago does not: the lapsed lease is seen"
    );
    assert!(
        due(b).await,
        "a look that found one leaves the turn to the next call"
    );

    // Released (an orphan with attempts left, for a claim): the next look finds none and takes
    // the turn, and a lease that lapses now waits for the next turn.
    let swept = h
        .coordinator()
        .dead_letter_expired(DeadLetterExpiredParams { limit: 100 })
        .await
        .expect("sweep");
    assert_eq!((swept.released(), swept.ended()), (1, 0), "{swept:?}");
    assert!(
        !due(a).await,
        "nothing lapsed, and an orphan with attempts left is a claim's"
    );
    h.set_lease_expiry(ids[1], chrono::Duration::seconds(-1))
        .await;
    assert!(!due(b).await, "the turn was taken just now");
    // A call with `lapsed_look_every` zero looks whenever no other call is looking.
    assert!(due_every(b, Duration::ZERO).await);

    // An orphan that must not run again is reported whatever the turn.
    h.set_lease_expiry(ids[1], chrono::Duration::seconds(60))
        .await;
    assert!(
        !due_every(b, Duration::ZERO).await,
        "nothing lapsed: the turn is taken"
    );
    h.request_cancel(ids[0]).await;
    assert!(
        due(a).await,
        "a cancelled orphan is the sweep's, turn or not"
    );
}

/// The work table is vacuumed only when it is due, and a vacuum leaves it not due.
pub async fn the_work_table_is_vacuumed_only_when_due(h: &dyn Harness) {
    let params = due_params(None);
    let due = || async {
        h.coordinator()
            .maintenance_due(params)
            .await
            .expect("due")
            .vacuum
    };
    let vacuum = || async {
        h.coordinator()
            .vacuum_work(VacuumWorkParams {})
            .await
            .expect("vacuum_work")
            .vacuumed
    };
    queue(h, "q", 1).await;
    let me = instance(h).await;
    enqueue(
        h,
        vec![NewWork::new("q", json!(1)), NewWork::new("q", json!(2))],
    )
    .await;
    // A claim leaves the available row versions dead: fewer than a fresh store's threshold.
    claim(h, me, &["q"], 2).await;
    assert!(!due().await, "two dead rows are not due a vacuum");
    assert!(!vacuum().await, "a vacuum that is not due does not run");

    h.make_vacuum_due().await;
    assert!(due().await, "due once the dead rows pass the threshold");
    assert!(vacuum().await, "a due vacuum runs");
    assert!(!due().await, "a vacuum leaves nothing due");
    assert!(!vacuum().await, "nor a second vacuum to run");
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
    // The two lapsed leases are released first (their owner is still registered), then every
    // orphan with no attempts left ends.
    assert_eq!(out.released, counts(&[("last", 1), ("more", 1)]));
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
            cancelled: 1,
            ..Default::default()
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
            cancelled: 0,
            ..Default::default()
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

/// Every registered queue with each waiting, running or blocked state, zero included.
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
    // Two items of one ordering key: the second waits blocked behind the first.
    enqueue(
        h,
        (0..2)
            .map(|i| NewWork::new("c", json!({ "n": i })).ordering_key("k"))
            .collect(),
    )
    .await;
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
    use WorkState::{Available, Blocked, Running, Scheduled};
    assert_eq!(
        got,
        vec![
            ("a", Available, 2),
            ("a", Scheduled, 1),
            ("a", Running, 1),
            ("a", Blocked, 0),
            ("b", Available, 0),
            ("b", Scheduled, 2),
            ("b", Running, 0),
            ("b", Blocked, 0),
            ("c", Available, 1),
            ("c", Scheduled, 0),
            ("c", Running, 0),
            ("c", Blocked, 1),
        ]
    );
    assert_eq!(out.get("b", Scheduled), 2);
    assert_eq!(out.get("nope", Running), 0);
}

/// The fleet shares one depth sample: a call returns the last one, anyone's, while it is
/// younger than its `max_age`, every count as of then, and counts anew (storing the count as
/// the fleet's sample) only once it is older; `max_age` zero always counts.
pub async fn the_fleet_samples_the_queue_depth_in_turns(h: &dyn Harness) {
    queue(h, "a", 10).await;
    let depth = |max_age: Duration| async move {
        h.coordinator()
            .queue_depth(QueueDepthParams { max_age })
            .await
            .expect("queue depth")
    };
    let hour = Duration::from_secs(3600);
    enqueue_n(h, "a", 3).await;
    // Nothing sampled yet: the first call counts, whatever its max_age.
    let first = depth(hour).await;
    assert_eq!(first.get("a", WorkState::Available), 3);
    assert!(first.sample_age < Duration::from_secs(30), "{first:?}");
    enqueue_n(h, "a", 2).await;
    // A peer's sample within the hour: read as it was, the two new items not counted.
    let reused = depth(hour).await;
    assert_eq!(reused.depths, first.depths);
    // Zero counts anew, and stores what it counted for the next caller.
    assert_eq!(
        depth(Duration::ZERO).await.get("a", WorkState::Available),
        5
    );
    enqueue_n(h, "a", 1).await;
    h.age_depth_sample(hour - Duration::from_secs(60)).await;
    let aged = depth(hour).await;
    assert_eq!(
        aged.get("a", WorkState::Available),
        5,
        "59 minutes old: still read"
    );
    assert!(
        (hour - Duration::from_secs(60)..hour).contains(&aged.sample_age),
        "the sample's age: {:?}",
        aged.sample_age
    );
    h.age_depth_sample(Duration::from_secs(120)).await;
    let fresh = depth(hour).await;
    assert_eq!(
        fresh.get("a", WorkState::Available),
        6,
        "61 minutes old: counted anew"
    );
    assert!(fresh.sample_age < Duration::from_secs(30), "{fresh:?}");
    // A queue registered after the sample appears at the next count, not before.
    queue(h, "b", 10).await;
    enqueue_n(h, "b", 2).await;
    let stale = depth(hour).await;
    assert!(stale.depths.iter().all(|d| d.queue == "a"), "{stale:?}");
    assert_eq!(
        depth(Duration::ZERO).await.get("b", WorkState::Available),
        2
    );
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
    let err = c
        .maintenance_due(MaintenanceDueParams {
            lapsed_look_every: MAX_TURN_PERIOD + Duration::from_secs(1),
            ..due_params(None)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("lapsed_look_every")),
        "{err}"
    );
    c.maintenance_due(MaintenanceDueParams {
        lapsed_look_every: MAX_TURN_PERIOD,
        ..due_params(None)
    })
    .await
    .expect("a day is accepted");
    let err = c
        .queue_depth(QueueDepthParams {
            max_age: MAX_TURN_PERIOD + Duration::from_secs(1),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("max_age")),
        "{err}"
    );
    c.queue_depth(QueueDepthParams {
        max_age: MAX_TURN_PERIOD,
    })
    .await
    .expect("a day is accepted");
    let err = c
        .ordering_repair(OrderingRepairParams {
            limit: 1,
            every: MAX_TURN_PERIOD + Duration::from_secs(1),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("every")),
        "{err}"
    );
    c.ordering_repair(OrderingRepairParams {
        limit: 1,
        every: MAX_TURN_PERIOD,
    })
    .await
    .expect("a day is accepted");
}

/// The depth sample also says, per queue and waiting state, how long the oldest due item has
/// waited, on the store's clock: an available item from its run_at, a due scheduled item not
/// yet promoted too; an item not yet due, a running one and an empty queue count as zero.
pub async fn queue_depth_reports_the_age_of_the_oldest_due_item_per_queue(h: &dyn Harness) {
    queue(h, "a", 10).await;
    queue(h, "b", 10).await;
    queue(h, "idle", 10).await;
    let me = instance(h).await;
    let waiting = enqueue_n(h, "a", 2).await;
    let later = enqueue_later(h, "a", 1).await[0];
    let overdue = enqueue_later(h, "b", 2).await;
    enqueue_later(h, "b", 1).await;
    // a: the older of two available items became due 120 s ago; its scheduled item is not due.
    h.set_run_at(waiting[0], chrono::Duration::seconds(-120))
        .await;
    h.set_run_at(later, chrono::Duration::seconds(600)).await;
    // b: two scheduled items due 40 s and 300 s ago, not promoted yet; one not due.
    h.set_run_at(overdue[0], chrono::Duration::seconds(-40))
        .await;
    h.set_run_at(overdue[1], chrono::Duration::seconds(-300))
        .await;
    let running = enqueue_n(h, "idle", 1).await[0];
    h.set_run_at(running, chrono::Duration::seconds(-500)).await;
    assert_eq!(
        ids(&claim(h, me, &["idle"], 1).await),
        HashSet::from([running])
    );

    let out = h
        .coordinator()
        .queue_depth(QueueDepthParams::default())
        .await
        .expect("queue depth");
    let age = |q: &str, s: WorkState| {
        out.depths
            .iter()
            .find(|d| d.queue == q && d.state == s)
            .map(|d| d.oldest_due_age)
            .unwrap_or_else(|| panic!("a row for {q} {s:?}"))
    };
    let about = |got: Duration, secs: u64| {
        (Duration::from_secs(secs)..Duration::from_secs(secs + 30)).contains(&got)
    };
    use WorkState::{Available, Running, Scheduled};
    assert!(about(age("a", Available), 120), "{:?}", age("a", Available));
    assert_eq!(age("a", Scheduled), Duration::ZERO, "not due yet");
    assert!(about(age("b", Scheduled), 300), "{:?}", age("b", Scheduled));
    assert_eq!(age("b", Available), Duration::ZERO);
    assert_eq!(
        age("idle", Running),
        Duration::ZERO,
        "running waits for nothing"
    );
    assert_eq!(age("idle", Available), Duration::ZERO, "nothing waits");
    assert!(about(out.pickup_lag("a"), 120), "{:?}", out.pickup_lag("a"));
    assert!(about(out.pickup_lag("b"), 300), "{:?}", out.pickup_lag("b"));
    assert_eq!(out.pickup_lag("idle"), Duration::ZERO);
    assert_eq!(out.pickup_lag("nope"), Duration::ZERO);
}
