//! The lease-renewal metrics, named in their final Prometheus form. Label values come from
//! small closed sets (a renewal result, a call outcome, a cancel reason), never an item id.
//! The host calls [`describe`] right after installing its exporter.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Renewal requests by what became of them; label `result`: `renewed`, `lost`, `busy`,
/// `evicted`, `skipped_max_renewals`, `skipped_max_duration`, `skipped_expired`, `skipped_disposed`,
/// `skipped_cancelled`, `failed_call`, `channel_full`.
pub const RENEWALS_TOTAL: &str = "workpump_lease_renewals_total";

/// `renew_leases` calls; label `outcome`: `ok`, `failed`, `timed_out` (abandoned).
pub const RENEWAL_CALLS_TOTAL: &str = "workpump_lease_renewal_calls_total";

/// Leases carried by one `renew_leases` call.
pub const RENEWAL_BATCH_SIZE: &str = "workpump_lease_renewal_batch_size";

/// How long a `renew_leases` call took until its reply (or until it was abandoned), in seconds.
pub const RENEWAL_CALL_DURATION_SECONDS: &str = "workpump_lease_renewal_call_duration_seconds";

/// `renew_leases` calls abandoned because they outlived the shortest remaining lease of their
/// batch.
pub const ABANDONED_CALLS_TOTAL: &str = "workpump_lease_renewal_abandoned_calls_total";

/// Firings of the local timers of a lease handle; label `reason`: `lease_fence` (deadline −
/// grace passed), `max_renewals` (the fence fired after the renewal cap stopped renewals),
/// `max_duration`.
pub const FENCE_FIRED_TOTAL: &str = "workpump_lease_fence_fired_total";

/// Every cancellation of a lease handle's token, by the reason that won; label `reason`: the
/// [`CancelReason`](crate::CancelReason) labels (`lease_fence`, `lease_lost`,
/// `cancel_requested`, `max_duration`, `max_renewals`, `shutdown`, `evicted`, `disposed`).
pub const HANDLE_CANCELS_TOTAL: &str = "workpump_lease_handle_cancels_total";

/// Lease handles alive now (one per dispatched item).
pub const HANDLES: &str = "workpump_lease_handles";

/// Describes every metric of this crate to the installed recorder.
pub fn describe() {
    describe_counter!(
        RENEWALS_TOTAL,
        Unit::Count,
        "Lease renewal requests by result (renewed, lost, busy, evicted, skipped_*, failed_call, channel_full)"
    );
    describe_counter!(
        RENEWAL_CALLS_TOTAL,
        Unit::Count,
        "renew_leases calls by outcome (ok, failed, timed_out)"
    );
    describe_histogram!(
        RENEWAL_BATCH_SIZE,
        Unit::Count,
        "Leases carried by one renew_leases call"
    );
    describe_histogram!(
        RENEWAL_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of a renew_leases call until its reply or its abandonment"
    );
    describe_counter!(
        ABANDONED_CALLS_TOTAL,
        Unit::Count,
        "renew_leases calls abandoned after outliving the shortest remaining lease of their batch"
    );
    describe_counter!(
        FENCE_FIRED_TOTAL,
        Unit::Count,
        "Local lease-handle timers that fired (lease_fence, max_renewals, max_duration)"
    );
    describe_counter!(
        HANDLE_CANCELS_TOTAL,
        Unit::Count,
        "Lease-handle cancellations by the reason that won"
    );
    describe_gauge!(HANDLES, Unit::Count, "Lease handles alive now");
}
