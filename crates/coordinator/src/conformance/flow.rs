//! Flow control (docs/flow-control.md): a queue's fleet-wide running limit (`max_running`) and
//! rate limit (a token bucket), enforced by `claim_work`, reported as throttles, set with the
//! queue's settings.

use std::time::Duration;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::ops_types::*;
use crate::types::*;

const HOUR: Duration = Duration::from_secs(3600);

async fn limited_queue(
    h: &dyn Harness,
    name: &str,
    max_attempts: i32,
    max_running: Option<u32>,
    rate: Option<RateLimit>,
) {
    let out = h
        .coordinator()
        .register_queue(
            RegisterQueueParams {
                max_attempts,
                ..RegisterQueueParams::new(name)
            }
            .max_running(max_running)
            .rate_limit(rate),
        )
        .await
        .expect("register a limited queue");
    assert_eq!((out.max_running, out.rate_limit), (max_running, rate));
}

/// An operator sets a queue's `max_running`.
async fn set_max_running(h: &dyn Harness, queue: &str, n: u32) {
    h.operations()
        .set_queue_settings(SetQueueSettingsParams {
            max_running: Some(Some(n)),
            ..SetQueueSettingsParams::new(queue)
        })
        .await
        .expect("set max_running");
}

fn throttled(q: &str, reason: ThrottleReason) -> Vec<(String, ThrottleReason)> {
    vec![(q.to_owned(), reason)]
}

fn reasons(out: &ClaimWorkOutcome) -> Vec<(String, ThrottleReason)> {
    out.throttles
        .iter()
        .map(|t| (t.queue.clone(), t.reason))
        .collect()
}

/// The seconds until the next token that a single rate throttle reports.
fn retry_after(out: &ClaimWorkOutcome) -> f64 {
    assert_eq!(out.throttles.len(), 1, "one throttle: {:?}", out.throttles);
    out.throttles[0]
        .retry_after
        .expect("a rate throttle says when")
        .as_secs_f64()
}

/// At most `max_running` items of a queue run across the fleet; a slot comes back when an item
/// completes, fails or is released; the throttle says so, with no time.
pub async fn the_running_limit_holds_across_instances_and_slots_come_back_when_items_end(
    h: &dyn Harness,
) {
    limited_queue(h, "q", 10, Some(2), None).await;
    let a = instance(h).await;
    let b = instance(h).await;
    enqueue_n(h, "q", 6).await;

    let first = claim(h, a, &["q"], 10).await;
    assert_eq!(first.items.len(), 2, "the limit, not max_items");
    assert!(
        !first.has_more,
        "a throttled queue never sets the drain hint"
    );
    assert_eq!(reasons(&first), throttled("q", ThrottleReason::Running));
    assert_eq!(first.throttles[0].retry_after, None, "no time is known");
    let other = claim(h, b, &["q"], 10).await;
    assert!(other.items.is_empty(), "the limit holds across instances");
    assert_eq!(reasons(&other), throttled("q", ThrottleReason::Running));

    // A completion frees a slot.
    complete(h, a, vec![first.items[0].fence]).await;
    let after_complete = claim(h, b, &["q"], 10).await;
    assert_eq!(after_complete.items.len(), 1);
    assert!(claim(h, b, &["q"], 10).await.items.is_empty());
    // A failure (retried) frees one.
    let failed = fail(
        h,
        a,
        first.items[1].fence,
        "boom",
        FailDisposition::RetryAfter(Duration::from_secs(3600)),
    )
    .await;
    assert_eq!(failed, Some(WorkState::Scheduled));
    let after_fail = claim(h, a, &["q"], 10).await;
    assert_eq!(after_fail.items.len(), 1);
    assert!(claim(h, a, &["q"], 10).await.items.is_empty());
    // A release frees one.
    h.coordinator()
        .release_work(ReleaseWorkParams {
            instance: a,
            items: vec![after_fail.items[0].fence],
            consume_attempt: false,
        })
        .await
        .expect("release");
    let after_release = claim(h, a, &["q"], 10).await;
    assert_eq!(after_release.items.len(), 1);
    let running = h
        .operations()
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview")
        .queues
        .into_iter()
        .find(|q| q.queue == "q")
        .expect("q in the overview");
    assert_eq!((running.running, running.max_running), (2, Some(2)));
}

/// A dead instance's expired lease still counts (its owner may be running it) until it is
/// reclaimed, and the reclaim is allowed at the limit; an expired last attempt, dead-lettered
/// by the claim, gives its slot back at once.
pub async fn a_dead_instances_slots_come_back_with_its_leases_and_a_reclaim_is_allowed_at_the_limit(
    h: &dyn Harness,
) {
    limited_queue(h, "q", 2, Some(2), None).await;
    let dead = instance(h).await;
    let live = instance(h).await;
    enqueue_n(h, "q", 4).await;
    let held = claim(h, dead, &["q"], 2).await;
    assert_eq!(held.items.len(), 2);

    // One lease expires: it still counts, so nothing fresh starts, but the orphan is reclaimed
    // once the sweep released it.
    h.set_lease_expiry(held.items[0].fence.id, chrono::Duration::seconds(-1))
        .await;
    sweep_lapsed(h).await;
    let reclaim = claim(h, live, &["q"], 10).await;
    let got: Vec<(WorkId, bool)> = reclaim
        .items
        .iter()
        .map(|c| (c.fence.id, c.reclaimed))
        .collect();
    assert_eq!(got, vec![(held.items[0].fence.id, true)]);
    assert_eq!(reasons(&reclaim), throttled("q", ThrottleReason::Running));

    // The reclaimed item's second attempt is its last: when that lease expires too, the sweep
    // releases it and makes it a dead letter, and its slot goes to a fresh item.
    h.set_lease_expiry(held.items[0].fence.id, chrono::Duration::seconds(-1))
        .await;
    assert_eq!(sweep_lapsed(h).await.dead_lettered(), 1);
    let fresh = claim(h, live, &["q"], 10).await;
    assert_eq!(fresh.items.len(), 1, "{:?}", fresh.items);
    assert!(!fresh.items[0].reclaimed);
    assert_eq!(row(h, held.items[0].fence.id).await.state, WorkState::Dead);
}

/// The bucket holds `limit` tokens: a burst of `limit`, then one token per `period / limit`;
/// the throttle says how long until the next, and an idle bucket never holds more than
/// `limit`.
pub async fn the_rate_limit_allows_a_burst_then_refills_over_time(h: &dyn Harness) {
    limited_queue(h, "q", 10, None, Some(RateLimit::new(3, HOUR))).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 12).await;

    let burst = claim(h, me, &["q"], 10).await;
    assert_eq!(burst.items.len(), 3, "a full bucket");
    assert!(!burst.has_more);
    assert_eq!(reasons(&burst), throttled("q", ThrottleReason::Rate));
    let wait = retry_after(&burst);
    assert!(
        (1190.0..=1200.0).contains(&wait),
        "one token per 20 min: {wait}"
    );
    let empty = claim(h, me, &["q"], 10).await;
    assert!(empty.items.is_empty());
    let wait = retry_after(&empty);
    assert!((1190.0..=1200.0).contains(&wait), "{wait}");

    h.age_rate_bucket("q", Duration::from_secs(20 * 60)).await;
    assert_eq!(claim(h, me, &["q"], 10).await.items.len(), 1, "one token");
    h.age_rate_bucket("q", 10 * HOUR).await;
    let refilled = claim(h, me, &["q"], 10).await;
    assert_eq!(refilled.items.len(), 3, "never more than the limit");
    assert_eq!(reasons(&refilled), throttled("q", ThrottleReason::Rate));
}

/// A reclaimed orphan is started again even with the bucket empty, and takes its token: the
/// bucket goes negative and later starts wait longer.
pub async fn a_reclaim_is_not_refused_by_the_rate_but_takes_a_token(h: &dyn Harness) {
    limited_queue(h, "q", 10, None, Some(RateLimit::new(2, HOUR))).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 4).await;
    let burst = claim(h, me, &["q"], 10).await;
    assert_eq!(burst.items.len(), 2);

    h.set_lease_expiry(burst.items[0].fence.id, chrono::Duration::seconds(-1))
        .await;
    sweep_lapsed(h).await;
    let reclaim = claim(h, me, &["q"], 10).await;
    assert_eq!(reclaim.items.len(), 1);
    assert!(reclaim.items[0].reclaimed);
    let wait = retry_after(&reclaim);
    assert!(
        (3590.0..=3600.0).contains(&wait),
        "two tokens owed at 30 min each: {wait}"
    );

    h.age_rate_bucket("q", Duration::from_secs(30 * 60)).await;
    let still = claim(h, me, &["q"], 10).await;
    assert!(still.items.is_empty(), "the reclaim's token was owed");
    assert_eq!(reasons(&still), throttled("q", ThrottleReason::Rate));
    h.age_rate_bucket("q", Duration::from_secs(30 * 60)).await;
    assert_eq!(claim(h, me, &["q"], 10).await.items.len(), 1);
}

/// A claim over a limited and an unlimited queue: the unlimited one is served as always (its
/// drain hint included), the limited one up to its limit, and only it is reported throttled.
/// An empty limited queue is not throttled.
pub async fn a_limit_throttles_only_its_queue_and_never_the_drain_hint(h: &dyn Harness) {
    limited_queue(h, "lim", 10, Some(1), None).await;
    limited_queue(h, "idle", 10, Some(1), Some(RateLimit::new(1, HOUR))).await;
    queue(h, "free", 10).await;
    let me = instance(h).await;
    enqueue_n(h, "lim", 3).await;
    enqueue_n(h, "free", 3).await;

    let both = claim(h, me, &["lim", "free", "idle"], 10).await;
    let mut per_queue: Vec<&str> = both.items.iter().map(|c| c.queue.as_str()).collect();
    per_queue.sort();
    assert_eq!(per_queue, vec!["free", "free", "free", "lim"]);
    assert!(!both.has_more);
    assert_eq!(reasons(&both), throttled("lim", ThrottleReason::Running));

    enqueue_n(h, "free", 3).await;
    let hint = claim(h, me, &["lim", "free"], 2).await;
    assert_eq!(hint.items.len(), 2);
    assert!(hint.items.iter().all(|c| c.queue == "free"));
    assert!(hint.has_more, "the unlimited queue has more");
    let nothing = claim(h, me, &["idle"], 10).await;
    assert!(nothing.items.is_empty() && nothing.throttles.is_empty());
}

/// The limits are queue settings: declared with the queue (one owner), changed by an operator
/// (a limit removed is unlimited again), shown in the overview; values out of range are refused
/// naming the setting, and nothing is written.
pub async fn flow_limits_are_queue_settings_and_bad_ones_are_refused(h: &dyn Harness) {
    let c = h.coordinator();
    let ops = h.operations();
    let refused = |err: Error, what: &str| {
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains(what)),
            "{what}: {err}"
        );
    };
    for (params, what) in [
        (
            RegisterQueueParams::new("q").max_running(Some(0)),
            "max_running",
        ),
        (
            RegisterQueueParams::new("q").max_running(Some(MAX_RUNNING_LIMIT + 1)),
            "max_running",
        ),
        (
            RegisterQueueParams::new("q").rate_limit(Some(RateLimit::new(0, HOUR))),
            "rate_limit",
        ),
        (
            RegisterQueueParams::new("q").rate_limit(Some(RateLimit::new(5, Duration::ZERO))),
            "rate_period",
        ),
        (
            RegisterQueueParams::new("q").rate_limit(Some(RateLimit::new(5, 25 * HOUR))),
            "rate_period",
        ),
    ] {
        refused(c.register_queue(params).await.expect_err(what), what);
    }
    let unknown = ops
        .set_queue_settings(SetQueueSettingsParams::new("q"))
        .await
        .expect_err("nothing was registered");
    assert!(matches!(unknown, Error::UnknownQueue(_)), "{unknown}");

    let rate = RateLimit::new(100, Duration::from_millis(1500));
    let declared = c
        .register_queue(
            RegisterQueueParams::new("q")
                .owned_by("shop")
                .max_running(Some(5))
                .rate_limit(Some(rate)),
        )
        .await
        .expect("declare");
    assert_eq!(
        (declared.max_running, declared.rate_limit),
        (Some(5), Some(rate))
    );
    let theirs = c
        .register_queue(RegisterQueueParams::new("q").owned_by("billing"))
        .await
        .expect("declare again");
    assert!(!theirs.applied, "another service's limits are not applied");
    assert_eq!(
        (theirs.max_running, theirs.rate_limit),
        (Some(5), Some(rate))
    );

    let bad = ops
        .set_queue_settings(SetQueueSettingsParams {
            max_running: Some(Some(0)),
            ..SetQueueSettingsParams::new("q")
        })
        .await
        .expect_err("0 is refused");
    refused(bad, "max_running");
    let kept = ops
        .set_queue_settings(SetQueueSettingsParams {
            max_running: Some(None),
            ..SetQueueSettingsParams::new("q")
        })
        .await
        .expect("remove the running limit");
    assert_eq!((kept.max_running, kept.rate_limit), (None, Some(rate)));
    let overview = ops
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview")
        .queues
        .into_iter()
        .find(|q| q.queue == "q")
        .expect("q");
    assert_eq!(
        (overview.max_running, overview.rate_limit),
        (None, Some(rate))
    );
    let none = ops
        .set_queue_settings(SetQueueSettingsParams {
            rate_limit: Some(None),
            ..SetQueueSettingsParams::new("q")
        })
        .await
        .expect("remove the rate");
    assert_eq!((none.max_running, none.rate_limit), (None, None));
    let me = instance(h).await;
    enqueue_n(h, "q", 3).await;
    let all = claim(h, me, &["q"], 10).await;
    assert_eq!(all.items.len(), 3, "unlimited again");
    assert!(all.throttles.is_empty());
}

/// Items already running when a queue gets its `max_running` count toward it: an operator's
/// limit of 3 on a queue with 3 running throttles the next claim, and its slots come back as
/// those items end.
pub async fn items_running_before_a_limit_is_set_count_toward_it(h: &dyn Harness) {
    limited_queue(h, "q", 10, None, None).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 6).await;
    let running = claim(h, me, &["q"], 3).await;
    assert_eq!(running.items.len(), 3);
    assert!(running.throttles.is_empty(), "no limit yet");

    set_max_running(h, "q", 3).await;
    let none = claim(h, me, &["q"], 10).await;
    assert!(
        none.items.is_empty(),
        "the three claimed before the limit count toward it"
    );
    assert_eq!(reasons(&none), throttled("q", ThrottleReason::Running));

    complete(h, me, vec![running.items[0].fence]).await;
    let one = claim(h, me, &["q"], 10).await;
    assert_eq!(one.items.len(), 1, "the slot of the item that ended");
}

/// The same when the owning service declares the limit (a host restarted with `max_running`
/// in its configuration): the items it has running count toward it.
pub async fn items_running_before_their_service_declares_a_limit_count_toward_it(h: &dyn Harness) {
    let declare = |max_running: Option<u32>| RegisterQueueParams {
        owner: Some("svc".into()),
        ..RegisterQueueParams::new("q").max_running(max_running)
    };
    h.coordinator()
        .register_queue(declare(None))
        .await
        .expect("declare unlimited");
    let me = instance(h).await;
    enqueue_n(h, "q", 4).await;
    let running = claim(h, me, &["q"], 2).await;
    assert_eq!(running.items.len(), 2);

    let out = h
        .coordinator()
        .register_queue(declare(Some(2)))
        .await
        .expect("declare the limit");
    assert!(out.applied, "the owner changes its own settings");
    let none = claim(h, me, &["q"], 10).await;
    assert!(
        none.items.is_empty(),
        "the two claimed before the declaration count toward it"
    );
    assert_eq!(reasons(&none), throttled("q", ThrottleReason::Running));
}

/// Lowering a limit stops no running item, and nothing starts until the items running above
/// the new limit have ended: each running item holds a slot (the lowest free ones, in claim
/// order), and while any holds one above the limit, claims take nothing, even when fewer items
/// than the limit are running. Then the limit holds again exactly.
pub async fn after_a_limit_is_lowered_nothing_starts_until_the_items_above_it_end(h: &dyn Harness) {
    limited_queue(h, "q", 10, Some(4), None).await;
    let me = instance(h).await;
    enqueue_n(h, "q", 10).await;
    let four = claim(h, me, &["q"], 4).await;
    assert_eq!(four.items.len(), 4);
    let fence = |i: usize| four.items[i].fence;

    set_max_running(h, "q", 2).await;
    let none = claim(h, me, &["q"], 10).await;
    assert!(none.items.is_empty(), "four run under a limit of two");
    assert_eq!(reasons(&none), throttled("q", ThrottleReason::Running));

    // The first two claimed hold slots 1 and 2: with them ended, two still run above.
    complete(h, me, vec![fence(0), fence(1)]).await;
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());
    // One left, in slot 4: still nothing starts, though one is fewer than the limit.
    complete(h, me, vec![fence(2)]).await;
    let still = claim(h, me, &["q"], 10).await;
    assert!(
        still.items.is_empty(),
        "slot 4 is still held above the limit"
    );
    assert_eq!(reasons(&still), throttled("q", ThrottleReason::Running));

    complete(h, me, vec![fence(3)]).await;
    let two = claim(h, me, &["q"], 10).await;
    assert_eq!(two.items.len(), 2, "the new limit, exactly");
    assert_eq!(reasons(&two), throttled("q", ThrottleReason::Running));

    // Raised again, the new slots are free at once.
    set_max_running(h, "q", 3).await;
    let one = claim(h, me, &["q"], 10).await;
    assert_eq!(one.items.len(), 1, "the one slot added");
}
