//! The claim worker's metrics, named in their final Prometheus form. Labels come from small
//! closed sets: the queue (configured), a result or outcome word, a reason word.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// claim_work calls, by queue and `result` (`items`, `empty`, `throttled` — nothing claimed
/// because of the queue's flow limit —, `unknown_queue`, `error`).
pub const POLLS: &str = "workpump_claim_polls_total";
/// Claims the store throttled, by queue and `reason` (`running`: the queue's `max_running`
/// reached; `rate`: its rate bucket empty), whether or not they claimed something
/// (docs/flow-control.md).
pub const THROTTLED: &str = "workpump_claim_throttled_total";
/// Orphans a claim ended instead of reclaiming them, by queue and `state` (`dead`: no attempts
/// left, a dead letter; `cancelled`: a cancel was requested): the lease of their last attempt
/// expired. The maintenance sweep counts the ones it finds first in its own metrics.
pub const ORPHANS_ENDED: &str = "workpump_claim_orphans_ended_total";
/// Items claimed, by queue and `kind` (`new`, `reclaimed`).
pub const CLAIMED: &str = "workpump_claimed_items_total";
/// How long a claim_work call took until its answer, in seconds, by queue (every call:
/// empty, with items, or failed).
pub const CLAIM_DURATION: &str = "workpump_claim_call_duration_seconds";
/// How long each claimed item waited from being due (its enqueue, its retry time or its
/// schedule) to its claim, in seconds on the database clock, by queue. Reclaimed orphans are
/// not recorded: their wait measures their dead owner, not the queue.
pub const PICKUP_LAG: &str = "workpump_pickup_lag_seconds";
/// Items per non-empty claim, by queue.
pub const BATCH_SIZE: &str = "workpump_claim_batch_size";
/// The wait chosen after each poll, by queue (absent while sleeping until a signal).
pub const POLL_WAIT: &str = "workpump_poll_wait_seconds";
/// Wake signals received, by `source` (`notify`, `local`, `reconnect`).
pub const WAKES: &str = "workpump_wake_signals_total";
/// 1 while LISTEN/NOTIFY delivers wake signals, else 0.
pub const GATE_HEALTHY: &str = "workpump_notify_gate_healthy";
/// NOTIFY gate transitions, by `to` (`healthy`, `unavailable`).
pub const GATE_TRANSITIONS: &str = "workpump_notify_gate_transitions_total";
/// Finished attempts, by queue and `outcome` (`completed`, `retried`, `dead`, `cancelled`,
/// `released`, `fenced_out`, `abandoned`, `rejected_expired`, `unrecorded`).
pub const ITEMS: &str = "workpump_items_total";
/// The [`ITEMS`] outcomes whose series the claim worker creates at 0 for each of its queues
/// when it starts, so that `increase()` sees their first occurrence.
pub const INITIALIZED_OUTCOMES: &[&str] = &["completed", "retried", "dead"];
/// Handler run time, by queue and `result` (`ok`, `error`, `panic`, `abandoned`).
pub const HANDLER_DURATION: &str = "workpump_handler_duration_seconds";
/// Handlers running now, by queue.
pub const IN_FLIGHT: &str = "workpump_in_flight";
/// Handler tokens fired, by queue and `reason`.
pub const HANDLER_CANCELLED: &str = "workpump_handler_cancellations_total";
/// Outcome writes, by `kind` (`complete`, `fail`, `release`) and `result` (`ok`, `error`).
pub const OUTCOME_WRITES: &str = "workpump_outcome_writes_total";
/// How long one outcome write took, its retries included, in seconds, by `kind` (`complete`,
/// `fail`, `release`).
pub const OUTCOME_WRITE_DURATION: &str = "workpump_outcome_write_duration_seconds";
/// Outcomes per write.
pub const OUTCOME_BATCH: &str = "workpump_outcome_batch_size";

/// Describes every metric above; the host calls it after installing a recorder.
pub fn describe() {
    describe_counter!(POLLS, Unit::Count, "claim_work calls by queue and result");
    describe_counter!(CLAIMED, Unit::Count, "work items claimed by queue and kind");
    describe_counter!(
        ORPHANS_ENDED,
        Unit::Count,
        "expired orphans a claim ended (dead letters, cancels) by queue and state"
    );
    describe_counter!(
        THROTTLED,
        Unit::Count,
        "claims throttled by a queue's flow limit, by queue and reason"
    );
    describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "claim_work call duration by queue"
    );
    describe_histogram!(
        PICKUP_LAG,
        Unit::Seconds,
        "wait of a claimed item from due to claim, by queue (reclaims excluded)"
    );
    describe_histogram!(BATCH_SIZE, Unit::Count, "items per non-empty claim");
    describe_histogram!(POLL_WAIT, Unit::Seconds, "wait chosen after a poll");
    describe_counter!(WAKES, Unit::Count, "wake signals by source");
    describe_gauge!(
        GATE_HEALTHY,
        Unit::Count,
        "1 while LISTEN/NOTIFY is healthy"
    );
    describe_counter!(GATE_TRANSITIONS, Unit::Count, "NOTIFY gate transitions");
    describe_counter!(ITEMS, Unit::Count, "finished attempts by queue and outcome");
    describe_histogram!(HANDLER_DURATION, Unit::Seconds, "handler run time");
    describe_gauge!(IN_FLIGHT, Unit::Count, "handlers running now by queue");
    describe_counter!(
        HANDLER_CANCELLED,
        Unit::Count,
        "handler tokens fired by reason"
    );
    describe_counter!(
        OUTCOME_WRITES,
        Unit::Count,
        "outcome statements by kind and result"
    );
    describe_histogram!(
        OUTCOME_WRITE_DURATION,
        Unit::Seconds,
        "outcome write duration by kind, retries included"
    );
    describe_histogram!(OUTCOME_BATCH, Unit::Count, "outcomes per statement");
}
