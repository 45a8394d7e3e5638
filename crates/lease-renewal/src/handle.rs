//! Lease handles: one per dispatched item, with the local lease fence, the renewal cadence and
//! the reason its cancellation token fired.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    CancelReason, Fence, InstanceId, LeaseSettings, LeaseTracker, TrackedLease,
};

use crate::metrics;

/// The shortest renewal tick a guard uses, so that an unvalidated zero interval cannot spin.
const MIN_TICK: Duration = Duration::from_millis(1);
/// How soon a renewal request that found the channel full is tried again.
const CHANNEL_FULL_RETRY: Duration = Duration::from_millis(50);

/// One renewal request on the worker's channel.
pub(crate) struct RenewalRequest {
    pub(crate) handle: Weak<Shared>,
    pub(crate) fence: Fence,
    pub(crate) instance: InstanceId,
    pub(crate) lease: Duration,
    /// When the request was put on the channel; the coalescing window counts from it.
    pub(crate) queued_at: Instant,
}

/// Why the worker left a requested lease out of a renewal call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SkipReason {
    MaxRenewals,
    MaxDuration,
    Expired,
    Disposed,
    Cancelled,
}

impl SkipReason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            SkipReason::MaxRenewals => "skipped_max_renewals",
            SkipReason::MaxDuration => "skipped_max_duration",
            SkipReason::Expired => "skipped_expired",
            SkipReason::Disposed => "skipped_disposed",
            SkipReason::Cancelled => "skipped_cancelled",
        }
    }
}

/// What the worker decided about one request.
pub(crate) enum Admission {
    /// Renew it; the handle's current deadline bounds the call's timeout.
    Include { deadline: Instant },
    /// Leave it out.
    Skip(SkipReason),
}

/// What a renewal reply did to a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The reply was for a handle that was disposed or already cancelled: nothing changed.
    Ignored,
    /// Applied.
    Applied,
}

/// The state a handle shares with the renewal worker (through a `Weak` in each request).
pub(crate) struct Shared {
    pub(crate) instance: InstanceId,
    pub(crate) fence: Fence,
    pub(crate) settings: LeaseSettings,
    /// When the claim was sent; the renewal cadence counts from it.
    sent_at: Instant,
    started_at: Instant,
    token: CancellationToken,
    state: Mutex<HandleState>,
    /// Wakes the guard when the deadline moved (a single waiter: `notify_one` keeps a permit).
    moved: Notify,
}

struct HandleState {
    deadline: Instant,
    renewals: u32,
    /// The reason the token fired with, once it fired.
    reason: Option<CancelReason>,
    /// Renewals stopped for good (the cap or max_duration); the fence then fires with it.
    stopped: Option<CancelReason>,
    disposed: bool,
    /// A request of this handle is on the channel or in a call that has not resolved: the
    /// guard does not queue another.
    queued: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HandleState> {
        // Every mutation completes under the lock, so a poisoned lock still holds sane data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the parent token fired, when nothing else was recorded first.
    fn observe(&self, st: &mut HandleState) {
        if st.reason.is_none() && self.token.is_cancelled() {
            st.reason = Some(CancelReason::Shutdown);
            count_cancel(CancelReason::Shutdown);
        }
    }

    /// Records `reason` unless another came first, then fires the token. Returns whether
    /// `reason` won.
    pub(crate) fn fire(&self, reason: CancelReason) -> bool {
        let won = {
            let mut st = self.lock();
            self.observe(&mut st);
            if st.reason.is_none() {
                st.reason = Some(reason);
                true
            } else {
                false
            }
        };
        self.token.cancel();
        if won {
            count_cancel(reason);
        }
        won
    }

    fn reason(&self) -> Option<CancelReason> {
        let mut st = self.lock();
        self.observe(&mut st);
        st.reason
    }

    fn fence_at(&self) -> Instant {
        fence_at(self.lock().deadline, self.settings.grace)
    }

    /// The worker asks before including the lease in a call. A skip releases the request.
    pub(crate) fn admit(&self, now: Instant) -> Admission {
        let mut st = self.lock();
        self.observe(&mut st);
        let skip = if st.disposed {
            Some(SkipReason::Disposed)
        } else if let Some(reason) = st.reason {
            Some(match reason {
                CancelReason::LeaseFence => SkipReason::Expired,
                CancelReason::MaxRenewals { .. } => SkipReason::MaxRenewals,
                CancelReason::MaxDuration { .. } => SkipReason::MaxDuration,
                CancelReason::Disposed => SkipReason::Disposed,
                _ => SkipReason::Cancelled,
            })
        } else if let Some(limit) = self
            .settings
            .max_renewals
            .filter(|limit| st.renewals >= *limit)
        {
            st.stopped
                .get_or_insert(CancelReason::MaxRenewals { limit });
            Some(SkipReason::MaxRenewals)
        } else if let Some(limit) = self
            .settings
            .max_duration
            .filter(|limit| now >= self.started_at + *limit)
        {
            st.stopped
                .get_or_insert(CancelReason::MaxDuration { limit });
            Some(SkipReason::MaxDuration)
        } else if now >= fence_at(st.deadline, self.settings.grace) {
            Some(SkipReason::Expired)
        } else {
            None
        };
        match skip {
            Some(reason) => {
                st.queued = false;
                Admission::Skip(reason)
            }
            None => Admission::Include {
                deadline: st.deadline,
            },
        }
    }

    /// The request resolved (or its call was abandoned): the guard may queue the next one.
    pub(crate) fn release(&self) {
        self.lock().queued = false;
    }

    /// The database extended the lease by `lease` at some moment after `sent_at`: the deadline
    /// moves to `sent_at + lease`, never backwards, unless the handle is finished.
    pub(crate) fn renewed(
        &self,
        sent_at: Instant,
        lease: Duration,
        cancel_requested: bool,
    ) -> Applied {
        {
            let mut st = self.lock();
            self.observe(&mut st);
            if st.disposed || st.reason.is_some() {
                return Applied::Ignored;
            }
            st.renewals = st.renewals.saturating_add(1);
            let confirmed = sent_at + lease;
            if confirmed > st.deadline {
                st.deadline = confirmed;
                self.moved.notify_one();
            }
        }
        if cancel_requested {
            self.fire(CancelReason::CancelRequested);
        }
        Applied::Applied
    }

    /// The database said the lease is gone.
    pub(crate) fn lost(&self) -> Applied {
        self.gone(CancelReason::LeaseLost)
    }

    /// The database said the instance is gone (reaped): every lease it held is lost.
    pub(crate) fn evicted(&self) -> Applied {
        self.gone(CancelReason::Evicted)
    }

    fn gone(&self, reason: CancelReason) -> Applied {
        if self.lock().disposed {
            return Applied::Ignored;
        }
        self.fire(reason);
        Applied::Applied
    }

    /// Queues a renewal request unless one is pending or renewals stopped.
    fn submit(&self, weak: Weak<Shared>, tx: &mpsc::Sender<RenewalRequest>) -> bool {
        {
            let mut st = self.lock();
            if st.queued || st.stopped.is_some() || st.disposed || self.token.is_cancelled() {
                return false;
            }
            st.queued = true;
        }
        let request = RenewalRequest {
            handle: weak,
            fence: self.fence,
            instance: self.instance,
            lease: self.settings.lease,
            queued_at: Instant::now(),
        };
        match tx.try_send(request) {
            Ok(()) => true,
            Err(e) => {
                self.release();
                let full = matches!(e, mpsc::error::TrySendError::Full(_));
                if full {
                    ::metrics::counter!(metrics::RENEWALS_TOTAL, "result" => "channel_full")
                        .increment(1);
                }
                tracing::warn!(
                    item = self.fence.id,
                    channel_full = full,
                    "lease renewal request not queued ({}); the lease keeps its deadline",
                    if full {
                        "the renewal channel is full"
                    } else {
                        "the renewal worker is gone"
                    }
                );
                false
            }
        }
    }
}

fn fence_at(deadline: Instant, grace: Duration) -> Instant {
    deadline.checked_sub(grace).unwrap_or(deadline)
}

fn count_cancel(reason: CancelReason) {
    ::metrics::counter!(metrics::HANDLE_CANCELS_TOTAL, "reason" => reason.label()).increment(1);
}

/// What dispatchers use to start tracking claimed items. Cheap to clone; every clone feeds the
/// same [`LeaseRenewalWorker`](crate::LeaseRenewalWorker).
#[derive(Clone, Debug)]
pub struct Leases {
    tx: mpsc::Sender<RenewalRequest>,
}

impl Leases {
    pub(crate) fn new(tx: mpsc::Sender<RenewalRequest>) -> Self {
        Leases { tx }
    }

    /// Starts tracking a freshly claimed item. `sent_at`: the tokio [`Instant`] when the
    /// `claim_work` call was sent; the first deadline is `sent_at + settings.lease` (from the
    /// send, never the reply: the database's expiry is at least that late). `parent`: the
    /// host's token (shutdown, eviction) — the handle's token is a child of it.
    ///
    /// The settings should have passed [`LeaseSettings::validate`]; unvalidated ones are not
    /// refused here (a zero interval ticks every millisecond instead of spinning).
    pub fn register(
        &self,
        instance: InstanceId,
        fence: Fence,
        sent_at: Instant,
        settings: LeaseSettings,
        parent: &CancellationToken,
    ) -> LeaseHandle {
        ::metrics::gauge!(metrics::HANDLES).increment(1.0);
        LeaseHandle {
            shared: Arc::new(Shared {
                instance,
                fence,
                settings,
                sent_at,
                started_at: Instant::now(),
                token: parent.child_token(),
                state: Mutex::new(HandleState {
                    deadline: sent_at + settings.lease,
                    renewals: 0,
                    reason: None,
                    stopped: None,
                    disposed: false,
                    queued: false,
                }),
                moved: Notify::new(),
            }),
            tx: self.tx.clone(),
        }
    }
}

/// The lease of one dispatched item (one claim: a reclaim gets a new handle). Owned by the
/// dispatch task; not `Clone`. Dropping it disposes it: the token fires (reason
/// [`CancelReason::Disposed`] unless another came first) and the worker skips its pending
/// renewals.
///
/// Its token fires at the lease fence (deadline − grace, on tokio's monotonic clock, no
/// database reply needed), when the database reports the lease lost, when an operator's cancel
/// arrives with a renewal reply, at `max_duration` since the handle was registered, when the
/// parent token fires (shutdown), on [`cancel`](Self::cancel), and on drop. The timers run in
/// [`guard`](Self::guard), which the dispatcher runs beside the handler.
pub struct LeaseHandle {
    shared: Arc<Shared>,
    tx: mpsc::Sender<RenewalRequest>,
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("LeaseHandle")
            .field("fence", &self.shared.fence)
            .field("instance", &self.shared.instance)
            .field("deadline", &st.deadline)
            .field("renewals", &st.renewals)
            .field("reason", &st.reason)
            .finish_non_exhaustive()
    }
}

impl LeaseHandle {
    /// The item and this claim's token.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The instance that claimed the item.
    pub fn instance(&self) -> InstanceId {
        self.shared.instance
    }

    /// The settings the handle runs on.
    pub fn settings(&self) -> LeaseSettings {
        self.shared.settings
    }

    /// A clone of the token that fires for every reason (see the type's docs).
    pub fn token(&self) -> CancellationToken {
        self.shared.token.clone()
    }

    /// Why the token fired, once it fired; the first reason wins. A token fired by its parent
    /// with no reason recorded first reads as [`CancelReason::Shutdown`].
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.shared.reason()
    }

    /// Fires the token with `reason` (e.g. [`CancelReason::Evicted`] from the claim worker),
    /// unless it already fired.
    pub fn cancel(&self, reason: CancelReason) {
        self.shared.fire(reason);
    }

    /// Why renewals stopped for good before the token fired: the renewal cap
    /// ([`CancelReason::MaxRenewals`]) or `max_duration`. The lease then lapses and the fence
    /// fires with this reason, so the dispatcher can report the exceeded limit.
    pub fn renewals_stopped(&self) -> Option<CancelReason> {
        self.shared.lock().stopped
    }

    /// Renewals the database confirmed for this claim.
    pub fn renewals(&self) -> u32 {
        self.shared.lock().renewals
    }

    /// When the handle was registered; `max_duration` counts from it.
    pub fn started_at(&self) -> Instant {
        self.shared.started_at
    }

    /// When the claim was sent (the renewal cadence counts from it).
    pub fn sent_at(&self) -> Instant {
        self.shared.sent_at
    }

    /// The local lease deadline: the send time of the last confirmed renewal (or of the
    /// claim) plus the lease. The database's expiry is never earlier.
    pub fn deadline(&self) -> Instant {
        self.shared.lock().deadline
    }

    /// Whether the lease fence has passed: `now >= deadline − grace`. Exact at the boundary
    /// (the instant the fence fires counts as expired) and independent of whether the guard
    /// ran. A claim worker uses it to skip a batch whose lease ran out before its handler
    /// started, reporting the item as unavailable instead of running it.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.shared.fence_at()
    }

    /// A cheap, cloneable reader of the cancel reason, for the handler's context.
    pub fn reason_reader(&self) -> CancelReasonReader {
        CancelReasonReader {
            shared: self.shared.clone(),
        }
    }

    /// Queues a renewal request now, outside the cadence (e.g. after a long synchronous step).
    /// Returns whether it was queued: not when one is already pending, renewals stopped, the
    /// token fired, or the channel is full (logged and counted as `channel_full`).
    pub fn request_renewal(&self) -> bool {
        self.shared.submit(Arc::downgrade(&self.shared), &self.tx)
    }

    /// Drives this item's timers until the token fires: queues a renewal request every
    /// `renewal_interval` from the claim's send time (a full channel counts as a failed
    /// renewal, logged and counted), fires the token at the lease fence (deadline − grace,
    /// re-armed whenever a confirmed renewal moves the deadline) and at `max_duration`. Run it
    /// beside the handler (`tokio::select!` or `join`). Returns once the token has fired.
    pub async fn guard(&self) {
        let s = &*self.shared;
        let interval = s.settings.renewal_interval.max(MIN_TICK);
        let max_at = s.settings.max_duration.map(|d| (s.started_at + d, d));
        let mut next_tick = s.sent_at + interval;
        loop {
            let moved = s.moved.notified();
            let fence_at = s.fence_at();
            tokio::select! {
                biased;
                _ = s.token.cancelled() => {
                    // Records Shutdown when the parent fired first.
                    let _ = s.reason();
                    return;
                }
                _ = sleep_until(max_at.map_or(fence_at, |(at, _)| at)), if max_at.is_some() => {
                    let limit = max_at.map_or(Duration::ZERO, |(_, d)| d);
                    let reason = CancelReason::MaxDuration { limit };
                    s.lock().stopped.get_or_insert(reason);
                    if s.fire(reason) {
                        count_fence(reason);
                        tracing::warn!(item = s.fence.id, "lease handle cancelled: {reason}");
                    }
                    return;
                }
                _ = sleep_until(fence_at) => {
                    if Instant::now() < s.fence_at() {
                        continue; // a renewal landed at the same instant
                    }
                    let reason = s.lock().stopped.unwrap_or(CancelReason::LeaseFence);
                    if s.fire(reason) {
                        count_fence(reason);
                        tracing::warn!(item = s.fence.id, "lease handle cancelled: {reason}");
                    }
                    return;
                }
                _ = sleep_until(next_tick) => {
                    let queued = s.submit(Arc::downgrade(&self.shared), &self.tx);
                    let now = Instant::now();
                    if !queued && self.tx.capacity() == 0 {
                        // The channel is full (a burst of handles whose ticks coincide): try
                        // again shortly instead of a whole interval later, while the lease
                        // still has most of its time.
                        next_tick = now + CHANNEL_FULL_RETRY.min(interval);
                        continue;
                    }
                    next_tick += interval;
                    if next_tick <= now {
                        // Ticks missed while the task was starved are not made up.
                        next_tick = now + interval;
                    }
                }
                _ = moved => {}
            }
        }
    }
}

fn count_fence(reason: CancelReason) {
    ::metrics::counter!(metrics::FENCE_FIRED_TOTAL, "reason" => reason.label()).increment(1);
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.shared.lock().disposed = true;
        self.shared.fire(CancelReason::Disposed);
        ::metrics::gauge!(metrics::HANDLES).decrement(1.0);
    }
}

/// Reads a handle's cancel reason from anywhere (the handler's context). Cheap to clone.
#[derive(Clone)]
pub struct CancelReasonReader {
    shared: Arc<Shared>,
}

impl CancelReasonReader {
    /// Why the token fired, once it fired (see [`LeaseHandle::cancel_reason`]).
    pub fn get(&self) -> Option<CancelReason> {
        self.shared.reason()
    }

    /// A clone of the handle's token.
    pub fn token(&self) -> CancellationToken {
        self.shared.token.clone()
    }
}

impl fmt::Debug for CancelReasonReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelReasonReader")
            .field("fence", &self.shared.fence)
            .field("reason", &self.get())
            .finish()
    }
}

/// The lease contract: the claim worker tracks its leases through `Arc<dyn LeaseTracker>`.
impl LeaseTracker for Leases {
    fn track(
        &self,
        instance: InstanceId,
        fence: Fence,
        sent_at: Instant,
        settings: LeaseSettings,
        parent: &CancellationToken,
    ) -> Arc<dyn TrackedLease> {
        Arc::new(self.register(instance, fence, sent_at, settings, parent))
    }
}

#[async_trait::async_trait]
impl TrackedLease for LeaseHandle {
    fn fence(&self) -> Fence {
        LeaseHandle::fence(self)
    }
    fn token(&self) -> CancellationToken {
        LeaseHandle::token(self)
    }
    fn cancel_reason(&self) -> Option<CancelReason> {
        LeaseHandle::cancel_reason(self)
    }
    fn cancel(&self, reason: CancelReason) {
        LeaseHandle::cancel(self, reason)
    }
    fn is_expired(&self) -> bool {
        LeaseHandle::is_expired(self)
    }
    async fn guard(&self) {
        LeaseHandle::guard(self).await
    }
    fn dispose(&self) {
        self.shared.lock().disposed = true;
        self.shared.fire(CancelReason::Disposed);
    }
}
