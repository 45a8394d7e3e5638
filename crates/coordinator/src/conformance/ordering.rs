//! Ordering keys (docs/ordering.md): one item of a queue and key at a time, in enqueue
//! order; what ends a head hands the key on (`ordering_advance`); dead heads held or skipped
//! per queue; the operator's view of held keys; the repair backstop (`ordering_repair`).

use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::ops_types::*;
use crate::types::*;
use WorkState::{Available, Blocked, Cancelled, Completed, Dead};

fn keyed(q: &str, key: &str, n: i64) -> NewWork {
    NewWork::new(q, json!({ "n": n })).ordering_key(key)
}

async fn states(h: &dyn Harness, ids: &[WorkId]) -> Vec<WorkState> {
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        out.push(row(h, id).await.state);
    }
    out
}

async fn set_dead_head(h: &dyn Harness, q: &str, mode: OrderingDeadHead) {
    h.operations()
        .set_queue_settings(SetQueueSettingsParams {
            queue: q.into(),
            max_attempts: None,
            owner: None,
            ordering_dead_head: Some(mode),
            max_running: None,
            rate_limit: None,
        })
        .await
        .expect("set ordering_dead_head");
}

/// Items of one key run one at a time in enqueue order (within a batch and across batches);
/// items of other keys, and unkeyed items, are claimable beside them.
pub async fn keyed_items_run_one_at_a_time_in_enqueue_order(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let a = enqueue(h, vec![keyed("q", "a", 0), keyed("q", "a", 1)]).await;
    let b = enqueue(h, vec![keyed("q", "b", 0)]).await;
    let a2 = enqueue(h, vec![keyed("q", "a", 2)]).await;
    let free = enqueue_n(h, "q", 1).await;
    assert_eq!(states(h, &a).await, vec![Available, Blocked]);
    assert_eq!(states(h, &a2).await, vec![Blocked]);
    assert_eq!(row(h, a[1]).await.ordering_key.as_deref(), Some("a"));

    let first = claim(h, me, &["q"], 10).await;
    let mut claimed: Vec<WorkId> = first.items.iter().map(|c| c.fence.id).collect();
    claimed.sort();
    // Sorted both: ids are not enqueue order across sessions (each caches its own block).
    let mut heads = vec![a[0], b[0], free[0]];
    heads.sort();
    assert_eq!(claimed, heads, "one head per key, and the unkeyed item");

    let order = [a[0], a[1], a2[0]];
    let mut fence = first
        .items
        .iter()
        .find(|c| c.fence.id == a[0])
        .unwrap()
        .fence;
    for next in &order[1..] {
        assert!(
            claim(h, me, &["q"], 10).await.items.is_empty(),
            "nothing of key a while its head runs"
        );
        complete(h, me, vec![fence]).await;
        let got = claim(h, me, &["q"], 10).await;
        assert_eq!(got.items.len(), 1);
        assert_eq!(
            got.items[0].fence.id, *next,
            "the next of the key, in enqueue order"
        );
        fence = got.items[0].fence;
    }
    complete(h, me, vec![fence]).await;
    assert_eq!(
        states(h, &order).await,
        vec![Completed, Completed, Completed]
    );
}

/// A head that fails with a retry keeps its key through its backoff: the next item waits
/// until the head completes.
pub async fn a_retrying_head_keeps_its_key(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue(h, vec![keyed("q", "k", 0), keyed("q", "k", 1)]).await;
    let head = claim_one(h, me, "q").await.fence;
    let next = fail(
        h,
        me,
        head,
        "boom",
        FailDisposition::RetryAfter(Duration::from_secs(60)),
    )
    .await;
    assert_eq!(next, Some(WorkState::Scheduled));
    assert_eq!(row(h, ids[1]).await.state, Blocked);
    h.set_run_at(ids[0], chrono::Duration::seconds(-1)).await;
    let again = claim(h, me, &["q"], 10).await;
    assert_eq!(again.items.len(), 1);
    assert_eq!(
        again.items[0].fence.id, ids[0],
        "the head again, not the next"
    );
    complete(h, me, vec![again.items[0].fence]).await;
    assert_eq!(row(h, ids[1]).await.state, Available);
}

/// In a queue that holds dead heads (the default) a dead letter blocks its key, later
/// enqueues of the key too, until an operator retries it (it runs first) or discards it
/// (the next runs); the operator lists the held key with the items waiting behind it.
pub async fn a_dead_head_holds_its_key_until_retried_or_discarded(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue(h, vec![keyed("q", "k", 0), keyed("q", "k", 1)]).await;
    let head = claim_one(h, me, "q").await.fence;
    assert_eq!(
        fail(h, me, head, "bad", FailDisposition::DeadLetter).await,
        Some(Dead)
    );
    let late = enqueue(h, vec![keyed("q", "k", 2)]).await[0];
    assert_eq!(states(h, &[ids[1], late]).await, vec![Blocked, Blocked]);
    assert!(claim(h, me, &["q"], 10).await.items.is_empty());

    let held = h
        .operations()
        .list_held_keys(ListHeldKeysParams::default())
        .await
        .expect("list held keys");
    assert_eq!(
        held.keys,
        vec![HeldKey {
            queue: "q".into(),
            ordering_key: "k".into(),
            dead_id: ids[0],
            blocked: 2,
        }]
    );

    // A retry makes the dead letter the head again: it runs before the others.
    retry(h, ids[0]).await.expect("retry");
    assert_eq!(row(h, ids[0]).await.state, Available);
    let again = claim_one(h, me, "q").await.fence;
    assert_eq!(again.id, ids[0]);
    fail(h, me, again, "bad again", FailDisposition::DeadLetter).await;

    // A discard releases the key: the next item runs.
    discard(h, ids[0]).await.expect("discard");
    assert_eq!(states(h, &[ids[1], late]).await, vec![Available, Blocked]);
    assert!(h
        .operations()
        .list_held_keys(ListHeldKeysParams::default())
        .await
        .expect("list held keys")
        .keys
        .is_empty());
}

/// In a queue that skips dead heads a dead letter hands its key on at once; retrying it
/// later puts it behind the key's current head instead of beside it.
pub async fn a_dead_head_is_skipped_in_a_skip_queue(h: &dyn Harness) {
    queue(h, "q", 10).await;
    set_dead_head(h, "q", OrderingDeadHead::Skip).await;
    let me = instance(h).await;
    let ids = enqueue(h, vec![keyed("q", "k", 0), keyed("q", "k", 1)]).await;
    let head = claim_one(h, me, "q").await.fence;
    fail(h, me, head, "bad", FailDisposition::DeadLetter).await;
    assert_eq!(row(h, ids[1]).await.state, Available);
    let late = enqueue(h, vec![keyed("q", "k", 2)]).await[0];
    assert_eq!(row(h, late).await.state, Blocked);
    let running = claim_one(h, me, "q").await.fence;
    assert_eq!(running.id, ids[1]);

    retry(h, ids[0]).await.expect("retry");
    assert_eq!(
        row(h, ids[0]).await.state,
        Blocked,
        "behind the running head"
    );
    complete(h, me, vec![running]).await;
    assert_eq!(
        states(h, &[ids[0], late]).await,
        vec![Available, Blocked],
        "the lowest id waiting goes first"
    );
    assert!(h
        .operations()
        .list_held_keys(ListHeldKeysParams::default())
        .await
        .expect("list held keys")
        .keys
        .is_empty());
}

/// Cancelling a blocked item ends it without touching the head; cancelling a waiting head
/// hands the key on; an operator's cancel of a running head ends it cancelled and hands on.
pub async fn cancel_of_a_blocked_item_or_of_a_head(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue(
        h,
        vec![
            keyed("q", "k", 0),
            keyed("q", "k", 1),
            keyed("q", "k", 2),
            keyed("q", "k", 3),
        ],
    )
    .await;
    cancel(h, ids[1]).await.expect("cancel blocked");
    assert_eq!(
        states(h, &ids).await,
        vec![Available, Cancelled, Blocked, Blocked]
    );
    cancel(h, ids[0]).await.expect("cancel the waiting head");
    assert_eq!(row(h, ids[2]).await.state, Available);
    let running = claim_one(h, me, "q").await.fence;
    assert_eq!(running.id, ids[2]);
    cancel(h, ids[2]).await.expect("request a cancel");
    assert_eq!(row(h, ids[3]).await.state, Blocked);
    assert_eq!(
        fail(h, me, running, "stopped", FailDisposition::Cancelled).await,
        Some(Cancelled)
    );
    assert_eq!(row(h, ids[3]).await.state, Available);
}

/// A head whose last attempt's lease expired ends dead in the sweep: held by default, handed
/// on in a skip queue.
pub async fn an_expired_last_attempt_of_a_head_follows_the_dead_head_rule(h: &dyn Harness) {
    queue(h, "hold", 1).await;
    queue(h, "skip", 1).await;
    set_dead_head(h, "skip", OrderingDeadHead::Skip).await;
    let me = instance(h).await;
    let held = enqueue(h, vec![keyed("hold", "k", 0), keyed("hold", "k", 1)]).await;
    let skipped = enqueue(h, vec![keyed("skip", "k", 0), keyed("skip", "k", 1)]).await;
    let a = claim_one(h, me, "hold").await.fence;
    let b = claim_one(h, me, "skip").await.fence;
    h.set_lease_expiry(a.id, chrono::Duration::seconds(-5))
        .await;
    h.set_lease_expiry(b.id, chrono::Duration::seconds(-5))
        .await;
    dead_letter(h, 100).await;
    assert_eq!(states(h, &held).await, vec![Dead, Blocked]);
    assert_eq!(states(h, &skipped).await, vec![Dead, Available]);
}

/// `ordering_dead_head` is one of the queue's settings: declared with it, kept against another
/// service's declaration, changed by an operator.
pub async fn the_dead_head_rule_is_a_queue_setting_with_one_owner(h: &dyn Harness) {
    let c = h.coordinator();
    let declared = c
        .register_queue(
            RegisterQueueParams::new("q")
                .owned_by("billing")
                .ordering_dead_head(OrderingDeadHead::Skip),
        )
        .await
        .expect("declare");
    assert_eq!(declared.ordering_dead_head, OrderingDeadHead::Skip);
    let other = c
        .register_queue(RegisterQueueParams::new("q").owned_by("shop"))
        .await
        .expect("declare");
    assert!(
        !other.applied,
        "another service's hold does not replace billing's skip"
    );
    assert_eq!(other.ordering_dead_head, OrderingDeadHead::Skip);
    let same = c
        .register_queue(
            RegisterQueueParams::new("q")
                .owned_by("billing")
                .ordering_dead_head(OrderingDeadHead::Hold),
        )
        .await
        .expect("declare");
    assert!(same.applied);
    assert_eq!(same.ordering_dead_head, OrderingDeadHead::Hold);
    let out = h
        .operations()
        .set_queue_settings(SetQueueSettingsParams {
            queue: "q".into(),
            max_attempts: None,
            owner: None,
            ordering_dead_head: Some(OrderingDeadHead::Skip),
            max_running: None,
            rate_limit: None,
        })
        .await
        .expect("set");
    assert_eq!(
        (
            out.ordering_dead_head,
            out.owner.as_deref(),
            out.max_attempts
        ),
        (OrderingDeadHead::Skip, Some("billing"), 10)
    );
}

/// The operator finds a key's items by the filter, and reads an item's key.
pub async fn the_operator_lists_a_keys_items_and_reads_an_items_key(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let ids = enqueue(
        h,
        vec![keyed("q", "a", 0), keyed("q", "b", 0), keyed("q", "a", 1)],
    )
    .await;
    enqueue_n(h, "q", 1).await;
    let ops = h.operations();
    let listed = ops
        .list_work(ListWorkParams {
            filter: WorkFilter::new().ordering_key("a"),
            ..ListWorkParams::default()
        })
        .await
        .expect("list");
    let got: Vec<(WorkId, WorkState)> = listed.items.iter().map(|i| (i.id, i.state)).collect();
    assert_eq!(got, vec![(ids[2], Blocked), (ids[0], Available)]);
    let blocked = ops
        .list_work(ListWorkParams {
            filter: WorkFilter::new().state(Blocked),
            ..ListWorkParams::default()
        })
        .await
        .expect("list");
    assert_eq!(blocked.items.len(), 1);
    let detail = ops
        .get_work(GetWorkParams { id: ids[2] })
        .await
        .expect("get");
    assert_eq!(detail.item.ordering_key.as_deref(), Some("a"));
    assert_eq!(detail.item.state, Blocked);
    let err = ops
        .list_work(ListWorkParams {
            filter: WorkFilter::new().ordering_key(""),
            ..ListWorkParams::default()
        })
        .await
        .expect_err("an empty key matches nothing");
    assert!(err.to_string().contains("ordering_keys"), "{err}");
}

/// A head released by a drain stays its key's head; a released head whose cancel was
/// requested ends cancelled and hands its key on.
pub async fn a_released_head_keeps_its_key_unless_it_ends(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let ids = enqueue(h, vec![keyed("q", "k", 0), keyed("q", "k", 1)]).await;
    let release = |fence: Fence| async move {
        h.coordinator()
            .release_work(ReleaseWorkParams {
                instance: me,
                items: vec![fence],
                consume_attempt: false,
            })
            .await
            .expect("release")
            .items[0]
            .state
    };
    let head = claim_one(h, me, "q").await.fence;
    assert_eq!(release(head).await, Some(Available));
    assert_eq!(states(h, &ids).await, vec![Available, Blocked]);
    let head = claim_one(h, me, "q").await.fence;
    assert_eq!(head.id, ids[0]);
    h.request_cancel(head.id).await;
    assert_eq!(release(head).await, Some(Cancelled));
    assert_eq!(row(h, ids[1]).await.state, Available);
}

/// When a batch's first item of a key is turned away by its unique key, the key's next item
/// of the batch is its head, not stranded behind nothing.
pub async fn a_keyed_item_turned_away_by_its_unique_key_leaves_the_next_as_head(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let holder = enqueue(h, vec![NewWork::new("q", json!({})).unique_key("u")]).await[0];
    let out = h
        .coordinator()
        .enqueue_work(EnqueueWorkParams {
            items: vec![keyed("q", "k", 0).unique_key("u"), keyed("q", "k", 1)],
        })
        .await
        .expect("enqueue")
        .items;
    assert_eq!((out[0].id, out[0].inserted), (holder, false));
    assert!(out[1].inserted);
    assert_eq!(row(h, out[1].id).await.state, Available);
}

/// The fleet checks for headless keys in turns: a call checks only when no check within its
/// `every`, anyone's, found every headless key; a store with nothing blocked takes no turn; a
/// check that repaired `limit` keys leaves the turn free so that the next call goes on.
pub async fn the_fleet_checks_ordering_keys_in_turns(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let hour = Duration::from_secs(3600);
    let repair = |limit: u32, every: Duration| async move {
        h.coordinator()
            .ordering_repair(OrderingRepairParams { limit, every })
            .await
            .expect("repair")
            .repaired
    };
    // Nothing blocked: no check, no turn taken (else the headless keys below would wait).
    assert_eq!(repair(100, hour).await, 0);
    let a = enqueue(h, vec![keyed("q", "a", 0), keyed("q", "a", 1)]).await;
    let b = enqueue(h, vec![keyed("q", "b", 0), keyed("q", "b", 1)]).await;
    let c = enqueue(h, vec![keyed("q", "c", 0), keyed("q", "c", 1)]).await;
    // Something blocked, nothing headless: the check takes the turn for the hour.
    assert_eq!(repair(100, hour).await, 0);
    for head in [a[0], b[0], c[0]] {
        h.delete_behind_the_stores_back(head).await;
    }
    assert_eq!(repair(100, hour).await, 0, "a peer's check within the hour");
    h.age_ordering_check(hour - Duration::from_secs(60)).await;
    assert_eq!(repair(100, hour).await, 0, "59 minutes ago still counts");
    h.age_ordering_check(Duration::from_secs(120)).await;
    // A check that repaired its whole limit leaves the turn free: the next call goes on.
    assert_eq!(repair(2, hour).await, 2);
    assert_eq!(repair(2, hour).await, 1, "the rest, at once");
    assert_eq!(repair(2, hour).await, 0);
    for ids in [&a, &b, &c] {
        assert_eq!(row(h, ids[1]).await.state, Available);
    }
    // That last check found fewer than its limit: the turn is taken again.
    let d = enqueue(h, vec![keyed("q", "d", 0), keyed("q", "d", 1)]).await;
    h.delete_behind_the_stores_back(d[0]).await;
    assert_eq!(repair(100, hour).await, 0, "checked within the hour");
    assert_eq!(
        repair(100, Duration::ZERO).await,
        1,
        "zero checks whenever it can"
    );
    assert_eq!(row(h, d[1]).await.state, Available);
}

/// A key left without a head by a write outside the store's functions is found by the
/// repair, which promotes its next item and counts it; a healthy store repairs nothing. An
/// item enqueued to the key meanwhile waits behind the item already waiting (the enqueue
/// looks for waiting items as well as for a head), so it never runs ahead of it.
pub async fn the_repair_promotes_the_next_item_of_a_key_left_without_a_head(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let ids = enqueue(h, vec![keyed("q", "k", 0), keyed("q", "k", 1)]).await;
    let repair = || async {
        h.coordinator()
            .ordering_repair(OrderingRepairParams {
                limit: 100,
                every: Duration::ZERO,
            })
            .await
            .expect("repair")
            .repaired
    };
    assert_eq!(repair().await, 0, "nothing to repair");
    h.delete_behind_the_stores_back(ids[0]).await;
    assert_eq!(row(h, ids[1]).await.state, Blocked);
    let later = enqueue(h, vec![keyed("q", "k", 2)]).await[0];
    assert_eq!(
        row(h, later).await.state,
        Blocked,
        "an item enqueued to a headless key with an item waiting waits too"
    );
    assert_eq!(repair().await, 1);
    assert_eq!(row(h, ids[1]).await.state, Available);
    assert_eq!(row(h, later).await.state, Blocked);
    assert_eq!(repair().await, 0);
}

/// A bad ordering key is refused naming the item and the problem, and nothing is written.
pub async fn a_bad_ordering_key_is_refused_naming_the_item(h: &dyn Harness) {
    queue(h, "q", 10).await;
    for bad in [String::new(), "x".repeat(129), "a\u{0}b".into()] {
        let err = h
            .coordinator()
            .enqueue_work(EnqueueWorkParams {
                items: vec![keyed("q", "ok", 0), keyed("q", &bad, 1)],
            })
            .await
            .expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("item 1") && msg.contains("ordering key"),
            "{msg}"
        );
    }
    assert_eq!(h.work_count().await, 0);
    let err = h
        .operations()
        .list_held_keys(ListHeldKeysParams {
            queue: None,
            limit: 0,
        })
        .await
        .expect_err("limit 0");
    assert!(err.to_string().contains("limit"), "{err}");
}

/// Enqueues of one key racing the completion of its heads never strand the key: at every
/// point the key has a head or nothing unfinished.
pub async fn enqueue_racing_completion_never_strands_a_key(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let c = h.coordinator();
    let producer = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..60 {
                let out = c
                    .enqueue_work(EnqueueWorkParams {
                        items: vec![keyed("q", "k", i)],
                    })
                    .await
                    .expect("enqueue");
                ids.push(out.items[0].id);
                tokio::task::yield_now().await;
            }
            ids
        })
    };
    let mut done = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while done.len() < 60 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key drained in time"
        );
        let got = claim(h, me, &["q"], 10).await;
        assert!(got.items.len() <= 1, "one item of the key at a time");
        for item in got.items {
            done.push(item.fence.id);
            complete(h, me, vec![item.fence]).await;
        }
        tokio::task::yield_now().await;
    }
    let ids = producer.await.expect("producer");
    assert_eq!(done, ids, "completed in enqueue order");
    assert_eq!(
        h.coordinator()
            .ordering_repair(OrderingRepairParams {
                limit: 100,
                every: Duration::ZERO,
            })
            .await
            .expect("repair")
            .repaired,
        0
    );
}

/// `complete_work` with the hand-off (the caller's queues and their leases).
async fn complete_handing_off(
    h: &dyn Harness,
    instance: InstanceId,
    items: Vec<Fence>,
    queues: &[&str],
) -> OutcomeBatch {
    h.coordinator()
        .complete_work(CompleteWorkParams {
            instance,
            items,
            hand_off: queues
                .iter()
                .map(|q| HandOff {
                    queue: (*q).into(),
                    lease: Duration::from_secs(60),
                })
                .collect(),
        })
        .await
        .expect("complete with hand-off")
}

/// A completion that asks for it takes its key's next item for the completing instance, in
/// the same write: leased to it with a fresh token, its first attempt, invisible to every
/// claimer; keys completed without asking, and unkeyed items, are as without.
pub async fn a_completion_hands_its_key_on_to_the_completer_when_asked(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let me = instance(h).await;
    let peer = instance(h).await;
    let k = enqueue(
        h,
        vec![keyed("q", "k", 0), keyed("q", "k", 1), keyed("q", "k", 2)],
    )
    .await;
    let j = enqueue(h, vec![keyed("q", "j", 0), keyed("q", "j", 1)]).await;
    let free = enqueue_n(h, "q", 1).await;
    let heads = claim(h, me, &["q"], 10).await;
    assert_eq!(
        heads.items.len(),
        3,
        "one head per key, and the unkeyed item"
    );
    let fence_of = |id: WorkId| heads.items.iter().find(|c| c.fence.id == id).unwrap().fence;

    let out = complete_handing_off(h, me, vec![fence_of(k[0]), fence_of(free[0])], &["q"]).await;
    assert!(out.all_recorded().is_ok());
    assert_eq!(
        out.handed_off.len(),
        1,
        "the key's next; nothing after the unkeyed item"
    );
    let handed = &out.handed_off[0];
    assert_eq!(handed.after, fence_of(k[0]));
    assert_eq!(
        handed.item.fence.id, k[1],
        "the key's next, in enqueue order"
    );
    assert_eq!(handed.item.queue, "q");
    assert_eq!(handed.item.attempt, 1);
    assert_eq!(handed.item.payload, json!({ "n": 1 }));
    assert!(!handed.item.reclaimed);
    let r = row(h, k[1]).await;
    assert_eq!(r.state, WorkState::Running);
    assert_eq!(r.instance, Some(me));
    assert!(r.has_lease);
    assert_eq!(r.claim_token, Some(handed.item.fence.token));
    assert_ne!(
        handed.item.fence.token,
        fence_of(k[0]).token,
        "a fresh token"
    );
    assert!(
        claim(h, peer, &["q"], 10).await.items.is_empty(),
        "nobody else can claim the key's head"
    );

    // j completed without asking: promoted for any claimer, as before.
    let out = complete(h, me, vec![fence_of(j[0])]).await;
    assert!(out.handed_off.is_empty());
    assert_eq!(row(h, j[1]).await.state, Available);

    // The handed item's token fences its writes; its completion hands on the last, and the
    // last's hands on nothing.
    let out = complete_handing_off(h, me, vec![handed.item.fence], &["q"]).await;
    assert!(out.all_recorded().is_ok());
    assert_eq!(out.handed_off.len(), 1);
    let last = out.handed_off[0].item.fence;
    assert_eq!(last.id, k[2]);
    let out = complete_handing_off(h, me, vec![last], &["q"]).await;
    assert!(out.all_recorded().is_ok());
    assert!(out.handed_off.is_empty(), "the key is drained");
    assert_eq!(states(h, &k).await, vec![Completed, Completed, Completed]);
}

/// Nothing is handed on where a claim would not take the item at once, or would have to
/// count it: a queue the caller did not list, a paused queue, a queue with a flow limit, a
/// next item not yet due; nor by a completion that was fenced out. Those keys' next items
/// are promoted as without a hand-off.
pub async fn a_hand_off_is_refused_where_a_claim_would_wait_or_count(h: &dyn Harness) {
    for q in ["unlisted", "paused", "limited", "later", "fenced"] {
        queue(h, q, 10).await;
    }
    let me = instance(h).await;
    let mut next = Vec::new();
    for q in ["unlisted", "paused", "limited", "fenced"] {
        next.push(enqueue(h, vec![keyed(q, "k", 0), keyed(q, "k", 1)]).await[1]);
    }
    let later = enqueue(
        h,
        vec![
            keyed("later", "k", 0),
            keyed("later", "k", 1).run_after(Duration::from_secs(3600)),
        ],
    )
    .await;
    let heads = claim(
        h,
        me,
        &["unlisted", "paused", "limited", "later", "fenced"],
        10,
    )
    .await;
    assert_eq!(heads.items.len(), 5);
    let fence_in = |q: &str| heads.items.iter().find(|c| c.queue == q).unwrap().fence;
    h.operations()
        .pause_queue(PauseQueueParams {
            queue: "paused".into(),
        })
        .await
        .expect("pause");
    h.operations()
        .set_queue_settings(SetQueueSettingsParams {
            max_running: Some(Some(5)),
            ..SetQueueSettingsParams::new("limited")
        })
        .await
        .expect("set max_running");
    let stale = Fence {
        id: fence_in("fenced").id,
        token: fence_in("fenced").token + 1_000_000,
    };

    let out = complete_handing_off(
        h,
        me,
        vec![
            fence_in("unlisted"),
            fence_in("paused"),
            fence_in("limited"),
            fence_in("later"),
            stale,
        ],
        &["paused", "limited", "later", "fenced"],
    )
    .await;
    assert!(out.handed_off.is_empty(), "{:?}", out.handed_off);
    assert_eq!(out.fenced_out().collect::<Vec<_>>(), vec![stale]);
    assert_eq!(
        states(h, &next).await,
        vec![Available, Available, Available, Blocked],
        "unlisted, paused and limited promoted as without; the fenced-out head still runs"
    );
    assert_eq!(row(h, later[1]).await.state, WorkState::Scheduled);
}
