//! `enqueue_work`: bulk batches, refusals, unique keys, schedules and priorities.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

/// Ten thousand items go in one call, in order, each with its own id.
pub async fn bulk_enqueue_of_ten_thousand_items_in_one_call(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let ids = enqueue_n(h, "q", 10_000).await;
    assert_eq!(ids.len(), 10_000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 10_000);
    assert_eq!(h.work_count().await, 10_000);
    assert_eq!(row(h, ids[1234]).await.payload, json!({"n": 1234}));
    assert_eq!(row(h, ids[9999]).await.payload, json!({"n": 9999}));
}

/// Bad input gets an error that names it, and nothing is written.
pub async fn enqueue_refuses_unknown_queues_oversized_batches_and_invalid_payloads_and_writes_nothing(
    h: &dyn Harness,
) {
    queue(h, "q", 10).await;
    let c = h.coordinator();
    let try_enqueue = |items: Vec<NewWork>| {
        let c = c.clone();
        async move { c.enqueue_work(EnqueueWorkParams { items }).await }
    };
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1)),
        NewWork::new("nope", json!(2)),
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "nope"),
        "{err}"
    );
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1));
        crate::MAX_ENQUEUE_BATCH + 1
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("exceeds the maximum")),
        "{err}"
    );
    let err = try_enqueue(vec![
        NewWork::new("q", json!(1)),
        NewWork::new("q", json!({"text": "nul \u{0} here"})),
    ])
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("item 1") && m.contains("NUL")),
        "{err}"
    );
    let err = try_enqueue(vec![NewWork::new("bad name!", json!(1))])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("queue name")),
        "{err}"
    );
    let err = try_enqueue(vec![]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(h.work_count().await, 0, "nothing was written");
}

/// A unique key holds while its item is unfinished.
pub async fn a_unique_key_returns_the_existing_item_while_it_is_unfinished(h: &dyn Harness) {
    queue(h, "q", 10).await;
    queue(h, "other", 10).await;
    let me = instance(h).await;
    let c = h.coordinator();
    let first = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![
                NewWork::new("q", json!(1)).unique_key("k"),
                NewWork::new("q", json!(2)).unique_key("k"),
                NewWork::new("other", json!(3)).unique_key("k"),
            ],
        })
        .await
        .expect("enqueue")
        .items;
    assert!(first[0].inserted);
    assert_eq!(
        first[1],
        Enqueued {
            id: first[0].id,
            inserted: false
        }
    );
    assert!(first[2].inserted && first[2].id != first[0].id);
    let running = claim_one(h, me, "q").await;
    let again = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(4)).unique_key("k")],
        })
        .await
        .expect("enqueue")
        .items[0];
    assert_eq!(
        again,
        Enqueued {
            id: first[0].id,
            inserted: false
        }
    );
    assert_eq!(h.work_count().await, 2);
    complete(h, me, vec![running.fence]).await;
    let after = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(5)).unique_key("k")],
        })
        .await
        .expect("enqueue")
        .items[0];
    assert!(after.inserted && after.id != first[0].id);
}

/// Delays and priorities land as given; max_attempts defaults to the queue's.
pub async fn scheduled_items_are_scheduled_and_priorities_kept(h: &dyn Harness) {
    queue(h, "q", 7).await;
    let ids = enqueue(
        h,
        vec![
            NewWork::new("q", json!(1))
                .run_after(Duration::from_secs(60))
                .priority(3),
            NewWork::new("q", json!(2)).max_attempts(2),
        ],
    )
    .await;
    let a = row(h, ids[0]).await;
    assert_eq!(
        (a.state, a.priority, a.max_attempts),
        (WorkState::Scheduled, 3, 7)
    );
    let b = row(h, ids[1]).await;
    assert_eq!((b.state, b.max_attempts), (WorkState::Available, 2));
}

/// An item's kind and metadata go in with it and come back with every claim and in the
/// operator's view; a kind out of range or metadata that is not an object is refused, naming
/// the item, and nothing of the batch is written.
pub async fn kinds_and_metadata_reach_the_claim_and_bad_ones_are_refused(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let c = h.coordinator();
    let trace = json!({ "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" });
    let out = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![
                NewWork::new("q", json!({"to": "a@b.c"}))
                    .kind("send_email")
                    .metadata(trace.clone()),
                NewWork::new("q", json!(2)),
            ],
        })
        .await
        .expect("enqueue");
    let me = instance(h).await;
    let claimed = claim(h, me, &["q"], 2).await.items;
    let typed = claimed
        .iter()
        .find(|w| w.fence.id == out.items[0].id)
        .expect("the typed item is claimed");
    assert_eq!(typed.kind.as_deref(), Some("send_email"));
    assert_eq!(typed.metadata.as_ref(), Some(&trace));
    let untyped = claimed
        .iter()
        .find(|w| w.fence.id == out.items[1].id)
        .expect("the untyped item is claimed");
    assert_eq!(
        (untyped.kind.as_deref(), untyped.metadata.as_ref()),
        (None, None)
    );
    let detail = h
        .operations()
        .get_work(crate::GetWorkParams {
            id: out.items[0].id,
        })
        .await
        .expect("get_work")
        .item;
    assert_eq!(detail.kind.as_deref(), Some("send_email"));
    assert_eq!(detail.metadata, Some(trace));

    let before = h.work_count().await;
    for (bad, words) in [
        (NewWork::new("q", json!(1)).kind(""), "job kind"),
        (
            NewWork::new("q", json!(1)).kind("k".repeat(129)),
            "job kind",
        ),
        (NewWork::new("q", json!(1)).kind("new\nline"), "job kind"),
        (
            NewWork::new("q", json!(1)).metadata(json!([1])),
            "metadata must be a JSON object",
        ),
        (
            NewWork::new("q", json!(1)).metadata(json!({"a": "nul \u{0}"})),
            "metadata",
        ),
    ] {
        let err = c
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new("q", json!(0)), bad],
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("item 1") && m.contains(words)),
            "{err}"
        );
    }
    assert_eq!(
        h.work_count().await,
        before,
        "nothing of a refused batch was written"
    );
}
