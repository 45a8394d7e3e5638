//! `renew_leases`: the owner fence, lost and cancelled leases, evicted callers, bad arguments.

use std::time::Duration;

use super::helpers::*;
use super::Harness;
use crate::error::Error;
use crate::types::*;

/// Renewal extends only rows fenced to the caller's instance and token.
pub async fn renewal_extends_only_leases_fenced_to_the_caller(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    enqueue_n(h, "q", 1).await;
    let item = claim_one(h, a, "q").await;
    let f = item.fence;
    let forged = Fence {
        id: f.id,
        token: f.token + 1_000_000,
    };
    let replies = renew(h, a, vec![f, forged]).await;
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].fence, f);
    assert_eq!(replies[0].status, RenewalStatus::Renewed);
    assert_eq!(replies[1].fence, forged);
    assert_eq!(replies[1].status, RenewalStatus::Lost);
    let by_peer = renew(h, b, vec![f]).await;
    assert_eq!(by_peer[0].status, RenewalStatus::Lost);
    let r = row(h, f.id).await;
    assert_eq!((r.renewals, r.instance), (1, Some(a)));
}

/// A finished or reclaimed item's renewal reports lost and changes nothing.
pub async fn renewal_of_a_finished_or_reclaimed_item_reports_lost(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    let b = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let done = claim_one(h, a, "q").await.fence;
    let taken = claim_one(h, a, "q").await.fence;
    complete(h, a, vec![done]).await;
    h.set_lease_expiry(taken.id, chrono::Duration::seconds(-1))
        .await;
    sweep_lapsed(h).await;
    let reclaimed = claim_one(h, b, "q").await;
    assert_eq!(reclaimed.fence.id, taken.id);
    let replies = renew(h, a, vec![done, taken]).await;
    assert!(replies.iter().all(|r| r.status == RenewalStatus::Lost));
    assert_eq!(row(h, done.id).await.state, WorkState::Completed);
    assert_eq!(row(h, taken.id).await.instance, Some(b));
}

/// A cancel request travels back in the renewal reply.
pub async fn renewal_reports_a_cancel_request(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let a = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let one = claim_one(h, a, "q").await.fence;
    let two = claim_one(h, a, "q").await.fence;
    h.request_cancel(two.id).await;
    let replies = renew(h, a, vec![one, two]).await;
    assert!(!replies[0].cancel_requested);
    assert!(replies[1].cancel_requested);
    assert_eq!(replies[1].status, RenewalStatus::Renewed);
}

/// Nothing in, nothing out; a bad lease is refused with a message naming it.
pub async fn renewal_of_an_empty_list_returns_nothing_and_bad_arguments_are_refused(
    h: &dyn Harness,
) {
    let a = instance(h).await;
    assert!(renew(h, a, vec![]).await.is_empty());
    let err = h
        .coordinator()
        .renew_leases(RenewLeasesParams {
            instance: a,
            leases: vec![Fence { id: 1, token: 1 }],
            lease: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("lease")),
        "{err}"
    );
}

/// An instance that was reaped (deleted and tombstoned) gets `evicted` for every lease it
/// renews — the lease it held, a forged token, anything — and nothing is renewed: the
/// instance is gone, and every lease with it. Its peers are not affected.
pub async fn renewal_by_an_evicted_instance_answers_evicted_for_every_lease(h: &dyn Harness) {
    queue(h, "q", 10).await;
    let gone = instance(h).await;
    let peer = instance(h).await;
    enqueue_n(h, "q", 2).await;
    let held: Vec<Fence> = claim(h, gone, &["q"], 2)
        .await
        .items
        .iter()
        .map(|c| c.fence)
        .collect();
    assert_eq!(held.len(), 2);
    h.age_heartbeat(gone, STALE * 2).await;
    let reaped: Vec<InstanceId> = cleanup(h, Some(DEAD))
        .await
        .reaped
        .iter()
        .map(|r| r.instance)
        .collect();
    assert_eq!(reaped, vec![gone]);
    let forged = Fence {
        id: held[0].id,
        token: held[0].token + 1_000_000,
    };
    let replies: Vec<(Fence, RenewalStatus, bool)> = renew(h, gone, vec![held[0], held[1], forged])
        .await
        .iter()
        .map(|r| (r.fence, r.status, r.cancel_requested))
        .collect();
    use RenewalStatus::Evicted;
    assert_eq!(
        replies,
        vec![
            (held[0], Evicted, false),
            (held[1], Evicted, false),
            (forged, Evicted, false)
        ]
    );
    for f in &held {
        assert_eq!(row(h, f.id).await.renewals, 0, "nothing was renewed");
    }
    // The peer takes the items over and renews its own leases as usual.
    let taken = claim(h, peer, &["q"], 10).await;
    assert_eq!(ids(&taken), held.iter().map(|f| f.id).collect());
    let fences: Vec<Fence> = taken.items.iter().map(|c| c.fence).collect();
    assert!(renew(h, peer, fences)
        .await
        .iter()
        .all(|r| r.status == RenewalStatus::Renewed));
}
