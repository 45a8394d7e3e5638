//! The operator's reads ([`crate::Operations`]): `list_work`, `get_work`, `queue_overview`,
//! `list_instances`.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::ops_types::*;
use crate::types::*;

async fn list(h: &dyn Harness, filter: WorkFilter) -> Vec<WorkId> {
    let out = h
        .operations()
        .list_work(ListWorkParams {
            filter,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(out.next_cursor, None, "one page holds every match");
    out.items.iter().map(|i| i.id).collect()
}

async fn detail(h: &dyn Harness, id: WorkId) -> GetWorkOutcome {
    h.operations()
        .get_work(GetWorkParams { id })
        .await
        .expect("get_work")
}

fn assert_invalid_argument(err: Error, has: &str) {
    match &err {
        Error::InvalidArgument(message) => assert!(message.contains(has), "{err}"),
        other => panic!("expected InvalidArgument mentioning {has:?}, got {other}"),
    }
}

/// Pages of three walk every item newest first; the last page has no cursor.
pub async fn list_work_pages_through_every_item_newest_first(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let mut ids = enqueue_n(h, "q", 7).await;
    ids.sort_unstable();
    ids.reverse();
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let out = h
            .operations()
            .list_work(ListWorkParams {
                filter: WorkFilter::new(),
                cursor: cursor.clone(),
                page_size: Some(3),
            })
            .await
            .expect("list");
        pages += 1;
        assert!(!out.scan_exhausted);
        assert!(out.items.len() <= 3);
        for item in &out.items {
            assert_eq!(
                (
                    item.queue.as_str(),
                    item.state,
                    item.attempt,
                    item.max_attempts
                ),
                ("q", WorkState::Available, 0, 10)
            );
            assert_eq!(
                (item.instance, item.finished_at, &item.last_error),
                (None, None, &None)
            );
        }
        seen.extend(out.items.iter().map(|i| i.id));
        match out.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    assert_eq!(seen, ids, "every item once, newest first");
    assert_eq!(pages, 3);
    // The default page holds them all.
    assert_eq!(list(h, WorkFilter::new()).await, ids);
}

/// Each criterion keeps exactly the items it names, and they combine.
pub async fn list_work_filters_by_queue_state_owner_time_and_error_text(h: &dyn Harness) {
    queue(h, "q1", 10).await;
    queue(h, "q2", 10).await;
    let me = instance(h).await;
    // Three q1 items: one dead with an error, one completed, one running; then three waiting.
    enqueue_n(h, "q1", 3).await;
    let dead = claim_one_of(h, me, "q1").await;
    fail(
        h,
        me,
        dead,
        "Boom: DISK full on /var",
        FailDisposition::DeadLetter,
    )
    .await;
    let done = claim_one_of(h, me, "q1").await;
    complete(h, me, vec![done]).await;
    let running = claim_one_of(h, me, "q1").await;
    let waiting = enqueue_n(h, "q1", 1).await[0];
    let later = enqueue_later(h, "q1", 1).await[0];
    let other_queue = enqueue_n(h, "q2", 1).await[0];
    let all: HashSet<WorkId> = list(h, WorkFilter::new()).await.into_iter().collect();
    assert_eq!(all.len(), 6, "the store holds the six items filtered below");

    let set = |v: Vec<WorkId>| v.into_iter().collect::<HashSet<_>>();
    let of = |ids: &[WorkId]| ids.iter().copied().collect::<HashSet<_>>();
    assert_eq!(
        set(list(h, WorkFilter::new().queue("q2")).await),
        of(&[other_queue])
    );
    assert_eq!(
        set(list(h, WorkFilter::new().state(WorkState::Dead)).await),
        of(&[dead.id])
    );
    assert_eq!(
        set(list(
            h,
            WorkFilter::new()
                .state(WorkState::Scheduled)
                .state(WorkState::Running)
        )
        .await),
        of(&[later, running.id])
    );
    assert_eq!(
        set(list(h, WorkFilter::new().instance(me)).await),
        of(&[running.id])
    );
    assert_eq!(
        set(list(h, WorkFilter::new().error_contains("disk FULL")).await),
        of(&[dead.id])
    );
    assert!(list(h, WorkFilter::new().error_contains("no such text"))
        .await
        .is_empty());
    assert!(
        list(h, WorkFilter::new().queue("q2").state(WorkState::Dead))
            .await
            .is_empty()
    );
    assert_eq!(
        set(list(
            h,
            WorkFilter::new()
                .queue("q1")
                .queue("q2")
                .state(WorkState::Available)
        )
        .await),
        of(&[waiting, other_queue])
    );

    // Time ranges are half open: [since, before).
    let created = detail(h, waiting).await.item.created_at;
    let since = set(list(h, WorkFilter::new().created(Some(created), None)).await);
    assert!(since.contains(&waiting), "since is inclusive");
    let before = set(list(h, WorkFilter::new().created(None, Some(created))).await);
    assert!(!before.contains(&waiting), "before is exclusive");
    assert_eq!(since.len() + before.len(), 6);
    let finished = detail(h, done.id).await.item.finished_at.expect("finished");
    assert_eq!(
        set(list(h, WorkFilter::new().finished(Some(finished), None)).await),
        of(&[done.id]),
        "only items that finished at or after it (the dead letter finished before)"
    );
    let until = finished + chrono::Duration::microseconds(1);
    assert_eq!(
        set(list(h, WorkFilter::new().finished(None, Some(until))).await),
        of(&[dead.id, done.id]),
        "a finished range leaves out unfinished items"
    );
    let summary = h
        .operations()
        .list_work(ListWorkParams {
            filter: WorkFilter::new().state(WorkState::Dead),
            ..Default::default()
        })
        .await
        .expect("list")
        .items
        .remove(0);
    assert_eq!(
        summary.last_error.as_deref(),
        Some("Boom: DISK full on /var")
    );
    assert_eq!((summary.attempt, summary.finished_at.is_some()), (1, true));
    let owned = &h
        .operations()
        .list_work(ListWorkParams {
            filter: WorkFilter::new().instance(me),
            ..Default::default()
        })
        .await
        .expect("list")
        .items[0];
    assert_eq!(
        (owned.instance, owned.lease_expiry.is_some()),
        (Some(me), true)
    );
}

/// Each item of a list carries its kind (none when untyped); the kinds criterion keeps the
/// items of the kinds it names, never an untyped one, and combines with the others; a kind no
/// item can have is refused, naming the key.
pub async fn list_work_shows_each_items_kind_and_filters_by_kinds(h: &dyn Harness) {
    queue(h, "q1", 10).await;
    queue(h, "q2", 10).await;
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q1", json!({ "to": "a@b.c" })).kind("send_email"),
            NewWork::new("q1", json!({ "month": 5 })).kind("invoice"),
            NewWork::new("q1", json!(3)),
            NewWork::new("q2", json!({ "to": "d@e.f" })).kind("send_email"),
        ],
    )
    .await;
    let (email, invoice, untyped, other_email) = (ids[0], ids[1], ids[2], ids[3]);
    let me = instance(h).await;
    let dead = claim_one_of(h, me, "q1").await;
    assert_eq!(dead.id, email, "the oldest item of q1 is claimed first");
    fail(h, me, dead, "smtp down", FailDisposition::DeadLetter).await;

    let page = h
        .operations()
        .list_work(ListWorkParams::default())
        .await
        .expect("list");
    let kinds: Vec<(WorkId, Option<&str>)> = page
        .items
        .iter()
        .map(|i| (i.id, i.kind.as_deref()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (other_email, Some("send_email")),
            (untyped, None),
            (invoice, Some("invoice")),
            (email, Some("send_email")),
        ],
        "every item with its kind, newest first"
    );

    let set = |v: Vec<WorkId>| v.into_iter().collect::<HashSet<_>>();
    let of = |ids: &[WorkId]| ids.iter().copied().collect::<HashSet<_>>();
    assert_eq!(
        set(list(h, WorkFilter::new().kind("send_email")).await),
        of(&[email, other_email])
    );
    assert_eq!(
        set(list(h, WorkFilter::new().kind("send_email").kind("invoice")).await),
        of(&[email, invoice, other_email]),
        "several kinds: any of them, and never an untyped item"
    );
    assert_eq!(
        set(list(h, WorkFilter::new().kind("send_email").queue("q1")).await),
        of(&[email])
    );
    assert_eq!(
        set(list(
            h,
            WorkFilter::new().kind("send_email").state(WorkState::Dead)
        )
        .await),
        of(&[email])
    );
    assert!(
        list(h, WorkFilter::new().kind("invoice").state(WorkState::Dead))
            .await
            .is_empty()
    );
    assert!(
        list(h, WorkFilter::new().kind("Send_Email"))
            .await
            .is_empty(),
        "a kind is matched exactly, case included"
    );

    for bad in [String::new(), "new\nline".to_owned(), "k".repeat(129)] {
        let err = h
            .operations()
            .list_work(ListWorkParams {
                filter: WorkFilter::new().kind(bad.clone()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_invalid_argument(err, "'kinds'");
    }
}

/// A cursor the store did not make, a page size out of range, an empty error text: a clear
/// invalid argument.
pub async fn list_work_refuses_a_malformed_cursor_and_out_of_range_arguments(h: &dyn Harness) {
    queue(h, "q", 10).await;
    enqueue_n(h, "q", 2).await;
    for cursor in [
        "garbage",
        "v1.",
        "v1.0",
        "v1.-3",
        "v1.12x",
        "v2.5",
        "v1.99999999999999999999",
    ] {
        let err = h
            .operations()
            .list_work(ListWorkParams {
                cursor: Some(cursor.into()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_invalid_argument(err, "malformed cursor");
    }
    for page_size in [0, MAX_PAGE_SIZE + 1] {
        let err = h
            .operations()
            .list_work(ListWorkParams {
                page_size: Some(page_size),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_invalid_argument(err, "page_size");
    }
    let err = h
        .operations()
        .list_work(ListWorkParams {
            filter: WorkFilter::new().error_contains(""),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_invalid_argument(err, "error_contains");
    // A cursor past the oldest item is well formed: an empty last page.
    let out = h
        .operations()
        .list_work(ListWorkParams {
            cursor: Some("v1.1".into()),
            ..Default::default()
        })
        .await
        .expect("list");
    assert!(out.items.is_empty() && out.next_cursor.is_none());
}

/// The whole item: payload, checkpoint, every attempt's error, the lease and its token.
pub async fn get_work_returns_the_whole_item_with_every_attempt(h: &dyn Harness) {
    queue(h, "q", 5).await;
    let me = instance(h).await;
    let id = enqueue(
        h,
        vec![NewWork::new("q", json!({"order": 42}))
            .unique_key("order-42")
            .priority(3)],
    )
    .await[0];
    let first = claim_one(h, me, "q").await;
    fail(
        h,
        me,
        first.fence,
        "first try failed",
        FailDisposition::RetryAfter(Duration::ZERO),
    )
    .await;
    let second = claim_one(h, me, "q").await;
    h.coordinator()
        .checkpoint_work(CheckpointWorkParams {
            instance: me,
            fence: second.fence,
            checkpoint: json!({"step": 2}),
        })
        .await
        .expect("checkpoint");
    renew(h, me, vec![second.fence]).await;
    let out = detail(h, id).await;
    let item = &out.item;
    assert_eq!(
        (item.id, item.queue.as_str(), item.state, item.priority),
        (id, "q", WorkState::Running, 3)
    );
    assert_eq!((item.attempt, item.max_attempts, item.renewals), (2, 5, 1));
    assert_eq!(item.payload, json!({"order": 42}));
    assert_eq!(item.checkpoint, Some(json!({"step": 2})));
    assert_eq!(item.unique_key.as_deref(), Some("order-42"));
    assert_eq!(item.claim_token, Some(second.fence.token));
    assert_eq!(item.instance, Some(me));
    assert!(!item.cancel_requested);
    let expiry = item.lease_expiry.expect("a lease");
    assert!(expiry > out.now, "the lease runs past the store's now");
    assert!(item.created_at <= out.now && item.finished_at.is_none());
    assert_eq!(item.history.len(), 1);
    let entry = &item.history[0];
    assert_eq!(
        (entry.attempt, entry.kind.as_str(), entry.error.as_str()),
        (1, "failed", "first try failed")
    );
    assert_eq!(entry.instance, Some(me.to_string()));
    let at = entry.at.expect("when");
    assert!(item.created_at <= at && at <= out.now);

    assert_not_found(
        h.operations()
            .get_work(GetWorkParams { id: 987_654_321 })
            .await
            .unwrap_err(),
        987_654_321,
    );
}

/// Counts per state, the pickup lag, the rates of the last hour and the settings, per queue.
pub async fn queue_overview_counts_states_lag_rates_and_settings(h: &dyn Harness) {
    queue(h, "a", 3).await;
    queue(h, "b", 10).await;
    queue(h, "idle", 10).await;
    h.operations()
        .pause_queue(PauseQueueParams { queue: "b".into() })
        .await
        .expect("pause");
    let me = instance(h).await;
    enqueue_n(h, "a", 6).await;
    // Finished within the hour: one completed, one rejected (a dead letter), one cancelled by
    // its handler; one failure retried; one running.
    let done = claim_one_of(h, me, "a").await;
    complete(h, me, vec![done]).await;
    let rejected = claim_one_of(h, me, "a").await;
    fail(h, me, rejected, "bad input", FailDisposition::DeadLetter).await;
    let stopped = claim_one_of(h, me, "a").await;
    fail(h, me, stopped, "stopped", FailDisposition::Cancelled).await;
    let retried = claim_one_of(h, me, "a").await;
    fail(h, me, retried, "flaky", FailDisposition::RetryAfter(HOUR)).await;
    claim_one_of(h, me, "a").await;
    // An old completion: counted, but outside the hour's rate.
    let old = claim_one_of(h, me, "a").await;
    complete(h, me, vec![old]).await;
    h.age_finished(old.id, 2 * HOUR).await;
    // A due item that has waited 90 s.
    let waiting = enqueue_later(h, "b", 1).await[0];
    h.set_run_at(waiting, chrono::Duration::seconds(-90)).await;
    assert_eq!(promote(h, 10).await.promoted(), 1);
    enqueue_n(h, "b", 1).await;

    let out = h
        .operations()
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview");
    let names: Vec<&str> = out.queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, ["a", "b", "idle"]);
    let a = out.get("a").expect("a");
    assert_eq!(
        (a.registered, a.paused, a.max_attempts),
        (true, false, Some(3))
    );
    assert_eq!((a.available, a.scheduled, a.running), (0, 1, 1));
    let exact = |items| Count { items, exact: true };
    assert_eq!(
        (a.completed, a.dead, a.cancelled),
        (exact(2), exact(1), exact(1))
    );
    assert_eq!(a.pickup_lag, None, "nothing available");
    let per_minute = |n: f64| Rate {
        per_minute: n / 60.0,
        exact: true,
    };
    assert_eq!(
        a.completed_per_minute,
        per_minute(1.0),
        "the old completion is out of the hour"
    );
    assert_eq!(a.dead_per_minute, per_minute(1.0));
    assert_eq!(
        a.failed_per_minute,
        2.0 / 60.0,
        "the rejection and the retried failure"
    );

    let b = out.get("b").expect("b");
    assert_eq!((b.paused, b.available, b.scheduled), (true, 2, 0));
    let lag = b.pickup_lag.expect("b has due items");
    assert!(
        lag >= Duration::from_secs(90) && lag < Duration::from_secs(150),
        "{lag:?}"
    );
    assert_eq!((b.completed, b.failed_per_minute), (exact(0), 0.0));

    let idle = out.get("idle").expect("idle");
    assert_eq!((idle.available, idle.scheduled, idle.running), (0, 0, 0));
    assert_eq!(
        (idle.pickup_lag, idle.completed_per_minute),
        (None, per_minute(0.0))
    );
    assert!(out.now.is_some());
}

/// Every instance with its host, metadata, heartbeat age, alive-lock and leases per queue.
pub async fn list_instances_reports_beats_locks_and_leases_per_queue(h: &dyn Harness) {
    queue(h, "q1", 10).await;
    queue(h, "q2", 10).await;
    let holder = instance(h).await;
    let _lock = take_lock(h, holder).await;
    let quiet = instance(h).await;
    h.age_heartbeat(quiet, Duration::from_secs(40)).await;
    enqueue_n(h, "q1", 2).await;
    enqueue_n(h, "q2", 1).await;
    let first = claim_one_of(h, holder, "q1").await;
    claim_one_of(h, holder, "q1").await;
    claim_one_of(h, holder, "q2").await;
    h.set_lease_expiry(first.id, chrono::Duration::seconds(-1))
        .await;

    let out = h
        .operations()
        .list_instances(ListInstancesParams {})
        .await
        .expect("instances");
    assert_eq!(out.instances.len(), 2, "{out:?}");
    let get = |id| {
        out.instances
            .iter()
            .find(|i| i.instance == id)
            .expect("listed")
    };
    let a = get(holder);
    assert_eq!(
        (a.host.as_str(), a.pid, a.version.as_deref()),
        ("test-host", Some(1), None)
    );
    assert_eq!(a.metadata, json!({"pid": 1}));
    assert!(a.alive_lock_held);
    assert_eq!((a.leases, a.expired_leases), (3, 1));
    assert_eq!(a.in_flight, counts(&[("q1", 2), ("q2", 1)]));
    assert!(a.heartbeat_age < Duration::from_secs(30));
    let b = get(quiet);
    assert!(!b.alive_lock_held);
    assert_eq!((b.leases, b.expired_leases, b.in_flight.len()), (0, 0, 0));
    assert!(
        b.heartbeat_age >= Duration::from_secs(40),
        "{:?}",
        b.heartbeat_age
    );
}

/// Claims one item of `q` (where several may wait) and returns its fence.
async fn claim_one_of(h: &dyn Harness, me: InstanceId, q: &str) -> Fence {
    claim_one(h, me, q).await.fence
}
