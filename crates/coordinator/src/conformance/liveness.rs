//! Instances and their liveness: `record_heartbeat`, `cleanup_stale_instances`, the alive-lock,
//! `deregister_instance`.

use std::time::Duration;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

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
                lapsed_look_every: Duration::ZERO,
            })
            .await
            .unwrap_err();
        refused(err, what);
    }
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
