//! [`decide`]: what to record for a handler's run. A pure function of how the run ended and
//! why its lease was cancelled, if it was, so every combination is tested by a table.

use std::time::Duration;

use workpump_coordinator::{CancelReason, FailDisposition};

use crate::handler::{Disposition, JobError};
use crate::recorder::Outcome;

/// How a handler's run ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Dropped before it returned: its wind-down after a cancel, or the drain timeout, ran out.
    Abandoned,
    /// It panicked, with this message.
    Panicked(String),
    /// It returned `Ok`; `in_transaction`: it completed the item in its fenced transaction.
    Succeeded { in_transaction: bool },
    /// It returned this error.
    Failed(JobError),
}

impl Ended {
    /// The `result` label of the handler-duration histogram.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Ended::Abandoned => "abandoned",
            Ended::Panicked(_) => "panic",
            Ended::Failed(_) => "error",
            Ended::Succeeded { .. } => "ok",
        }
    }
}

/// What to record for a run that `ended` so, its lease cancelled for `reason` (if it was);
/// `backoff` is the queue's retry delay for this attempt. `None`: record nothing — the store
/// took the lease (or the instance) away, so a write would be fenced out and a drain release
/// could undo a peer's claim; or the handler already completed the item in its transaction;
/// or it was abandoned for a reason that leaves the item to be reclaimed.
pub(crate) fn decide(
    ended: Ended,
    reason: Option<CancelReason>,
    backoff: Duration,
) -> Option<Outcome> {
    if matches!(
        reason,
        Some(CancelReason::LeaseLost | CancelReason::Evicted)
    ) {
        return None;
    }
    let retry = |error: String| Outcome::Fail {
        error,
        disposition: FailDisposition::RetryAfter(backoff),
    };
    match ended {
        Ended::Abandoned => match reason {
            Some(CancelReason::Shutdown) => Some(Outcome::Release {
                consume_attempt: false,
            }),
            Some(r @ (CancelReason::MaxDuration { .. } | CancelReason::MaxRenewals { .. })) => {
                Some(retry(format!("the handler was stopped: {r}")))
            }
            Some(CancelReason::CancelRequested) => Some(Outcome::Fail {
                error: "cancelled on request (the handler did not stop in time)".into(),
                disposition: FailDisposition::Cancelled,
            }),
            _ => None,
        },
        Ended::Panicked(message) => Some(retry(format!("the handler panicked: {message}"))),
        Ended::Succeeded { in_transaction } => (!in_transaction).then_some(Outcome::Complete),
        Ended::Failed(e) => Some(match (e.kind, reason) {
            (Disposition::DeadLetter, _) => Outcome::Fail {
                error: e.message,
                disposition: FailDisposition::DeadLetter,
            },
            (_, Some(CancelReason::Shutdown)) => Outcome::Release {
                consume_attempt: false,
            },
            // Stopped by its own lease fence or a limit, not by anyone's cancel: a failed
            // attempt (retried) naming why, never a cancelled item — also when the handler
            // answers its token with `JobError::cancelled`.
            (
                _,
                Some(
                    r @ (CancelReason::LeaseFence
                    | CancelReason::MaxDuration { .. }
                    | CancelReason::MaxRenewals { .. }),
                ),
            ) => retry(format!("the handler was stopped: {r}: {}", e.message)),
            (Disposition::Cancelled, _) | (_, Some(CancelReason::CancelRequested)) => {
                Outcome::Fail {
                    error: e.message,
                    disposition: FailDisposition::Cancelled,
                }
            }
            (Disposition::Retry { after }, _) => Outcome::Fail {
                error: e.message,
                disposition: FailDisposition::RetryAfter(after.unwrap_or(backoff)),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Duration = Duration::from_secs(8);
    const AFTER: Duration = Duration::from_secs(2);

    /// The outcome in words, so the table reads as a table.
    fn words(outcome: Option<Outcome>) -> String {
        match outcome {
            None => "nothing".into(),
            Some(Outcome::Complete) => "complete".into(),
            Some(Outcome::Release { consume_attempt }) => {
                format!("release (attempt counted: {consume_attempt})")
            }
            Some(Outcome::Fail { error, disposition }) => {
                let to = match disposition {
                    FailDisposition::RetryAfter(d) => format!("retry after {}s", d.as_secs()),
                    FailDisposition::DeadLetter => "dead letter".into(),
                    FailDisposition::Cancelled => "cancelled".into(),
                };
                format!("{to}: {error}")
            }
        }
    }

    fn failed(kind: &str) -> Ended {
        Ended::Failed(match kind {
            "retry" => JobError::retry("boom"),
            "retry_after" => JobError::retry_after("boom", AFTER),
            "dead_letter" => JobError::dead_letter("boom"),
            "cancelled" => JobError::cancelled("boom"),
            other => panic!("no such error kind {other}"),
        })
    }

    #[test]
    fn every_way_a_run_ends_maps_to_one_outcome() {
        use CancelReason::*;
        let max_duration = MaxDuration {
            limit: Duration::from_secs(60),
        };
        let max_renewals = MaxRenewals { limit: 3 };
        let ok = || Ended::Succeeded {
            in_transaction: false,
        };
        #[rustfmt::skip]
        let table: Vec<(Ended, Option<CancelReason>, &str)> = vec![
            // Success.
            (ok(), None, "complete"),
            (Ended::Succeeded { in_transaction: true }, None, "nothing"),
            (ok(), Some(Shutdown), "complete"),
            (ok(), Some(CancelRequested), "complete"),
            (ok(), Some(LeaseFence), "complete"),
            // The store took the lease or the instance: never write, whatever the handler said.
            (ok(), Some(LeaseLost), "nothing"),
            (ok(), Some(Evicted), "nothing"),
            (failed("dead_letter"), Some(LeaseLost), "nothing"),
            (Ended::Panicked("p".into()), Some(Evicted), "nothing"),
            (Ended::Abandoned, Some(LeaseLost), "nothing"),
            // Errors the handler returned, without a cancel.
            (failed("retry"), None, "retry after 8s: boom"),
            (failed("retry_after"), None, "retry after 2s: boom"),
            (failed("dead_letter"), None, "dead letter: boom"),
            (failed("cancelled"), None, "cancelled: boom"),
            // ... after a cancel: a drain releases without counting the attempt; a dead letter
            // stays one.
            (failed("retry"), Some(Shutdown), "release (attempt counted: false)"),
            (failed("cancelled"), Some(Shutdown), "release (attempt counted: false)"),
            (failed("dead_letter"), Some(Shutdown), "dead letter: boom"),
            // ... its own fence or a limit stopped it: a retried attempt that says why.
            (failed("retry"), Some(LeaseFence),
                "retry after 8s: the handler was stopped: the lease fence fired: the lease was not renewed before its deadline minus the grace: boom"),
            (failed("cancelled"), Some(max_duration),
                "retry after 8s: the handler was stopped: exceeded max_duration (60s): boom"),
            (failed("retry_after"), Some(max_renewals),
                "retry after 8s: the handler was stopped: exceeded max_renewals (3): boom"),
            // ... an operator's cancel: the item ends cancelled.
            (failed("retry"), Some(CancelRequested), "cancelled: boom"),
            (failed("retry_after"), Some(CancelRequested), "cancelled: boom"),
            (failed("cancelled"), Some(CancelRequested), "cancelled: boom"),
            // A dropped handle cancels nothing the decision looks at.
            (failed("retry"), Some(Disposed), "retry after 8s: boom"),
            // Panics. (A payload that does not decode is the handler service's dead letter.)
            (Ended::Panicked("oops".into()), None, "retry after 8s: the handler panicked: oops"),
            (Ended::Panicked("oops".into()), Some(Shutdown), "retry after 8s: the handler panicked: oops"),
            // Abandoned after its wind-down or the drain timeout.
            (Ended::Abandoned, Some(Shutdown), "release (attempt counted: false)"),
            (Ended::Abandoned, Some(max_duration), "retry after 8s: the handler was stopped: exceeded max_duration (60s)"),
            (Ended::Abandoned, Some(max_renewals), "retry after 8s: the handler was stopped: exceeded max_renewals (3)"),
            (Ended::Abandoned, Some(CancelRequested), "cancelled: cancelled on request (the handler did not stop in time)"),
            (Ended::Abandoned, Some(LeaseFence), "nothing"),
            (Ended::Abandoned, None, "nothing"),
        ];
        let mut wrong = Vec::new();
        let rows = table.len();
        for (ended, reason, want) in table {
            let row = format!("{ended:?} / {reason:?}");
            let got = words(decide(ended, reason, BACKOFF));
            if got != want {
                wrong.push(format!("{row}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert_eq!(rows, 32, "the table lost or gained a row");
    }

    #[test]
    fn each_ending_has_its_histogram_label() {
        let labels: Vec<&str> = [
            Ended::Abandoned,
            Ended::Panicked(String::new()),
            Ended::Succeeded {
                in_transaction: false,
            },
            Ended::Failed(JobError::retry("x")),
        ]
        .iter()
        .map(Ended::label)
        .collect();
        assert_eq!(labels, vec!["abandoned", "panic", "ok", "error"]);
    }
}
