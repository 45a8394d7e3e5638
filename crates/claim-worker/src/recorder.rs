//! Outcome writes, coalesced: every outcome that arrives while a write is in flight goes out
//! with the next one, one statement per kind (complete, fail, release) and instance. At low
//! load an outcome is written at once; under load the statements carry hundreds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use workpump_coordinator::{
    ClaimedWork, CompleteWorkParams, Error, FailDisposition, FailWorkParams, Failure, Fence,
    HandOff, HealthReporter, InstanceId, OutcomeBatch, ReleaseWorkParams, WorkCoordinator,
    WorkState,
};

use crate::metrics;

/// What to write for one attempt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    Complete,
    Fail {
        error: String,
        disposition: FailDisposition,
    },
    Release {
        consume_attempt: bool,
    },
}

/// What the write did: the state the item went to, `None` when fenced out; `Err` when the
/// store could not be reached after retries (the item will be reclaimed when its lease lapses).
pub(crate) type Recorded = Result<Option<WorkState>, String>;

struct Request {
    instance: InstanceId,
    fence: Fence,
    outcome: Outcome,
    /// A completion that may take its ordering key's next item (docs/ordering.md).
    hand_off: Option<HandOff>,
    reply: oneshot::Sender<(Recorded, Option<ClaimedWork>)>,
}

/// The sending side; cheap to clone. The writer stops when every sender is gone.
#[derive(Clone)]
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<Request>,
}

impl Recorder {
    /// The recorder and its writer loop (to be awaited by the owner).
    /// `health` is degraded while writes fail (after their retries) and healthy again at
    /// the next write the store answered.
    pub(crate) fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        batch: usize,
        health: HealthReporter,
    ) -> (Recorder, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Recorder { tx }, write_loop(coordinator, rx, batch, health))
    }

    /// Writes `outcome` for the claim and waits for the result.
    pub(crate) async fn record(
        &self,
        instance: InstanceId,
        fence: Fence,
        outcome: Outcome,
    ) -> Recorded {
        self.send(instance, fence, outcome, None).await.0
    }

    /// Writes the claim's completion, asking for its ordering key's next item when
    /// `hand_off` says so, and waits for the result and the item handed on, if any.
    pub(crate) async fn complete(
        &self,
        instance: InstanceId,
        fence: Fence,
        hand_off: Option<HandOff>,
    ) -> (Recorded, Option<ClaimedWork>) {
        self.send(instance, fence, Outcome::Complete, hand_off)
            .await
    }

    async fn send(
        &self,
        instance: InstanceId,
        fence: Fence,
        outcome: Outcome,
        hand_off: Option<HandOff>,
    ) -> (Recorded, Option<ClaimedWork>) {
        let stopped = || (Err("the outcome writer has stopped".into()), None);
        let (reply, rx) = oneshot::channel();
        let request = Request {
            instance,
            fence,
            outcome,
            hand_off,
            reply,
        };
        if self.tx.send(request).is_err() {
            return stopped();
        }
        rx.await.unwrap_or_else(|_| stopped())
    }
}

async fn write_loop(
    coordinator: Arc<dyn WorkCoordinator>,
    mut rx: mpsc::UnboundedReceiver<Request>,
    batch: usize,
    health: HealthReporter,
) {
    let mut pending = Vec::with_capacity(batch);
    while rx.recv_many(&mut pending, batch).await > 0 {
        flush(&*coordinator, std::mem::take(&mut pending), &health).await;
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Complete,
    Fail,
    Release(bool),
}

async fn flush(coordinator: &dyn WorkCoordinator, requests: Vec<Request>, health: &HealthReporter) {
    let mut groups: BTreeMap<(InstanceId, Kind), Vec<Request>> = BTreeMap::new();
    for r in requests {
        let kind = match &r.outcome {
            Outcome::Complete => Kind::Complete,
            Outcome::Fail { .. } => Kind::Fail,
            Outcome::Release { consume_attempt } => Kind::Release(*consume_attempt),
        };
        groups.entry((r.instance, kind)).or_default().push(r);
    }
    for ((instance, kind), group) in groups {
        let label = match kind {
            Kind::Complete => "complete",
            Kind::Fail => "fail",
            Kind::Release(_) => "release",
        };
        ::metrics::histogram!(metrics::OUTCOME_BATCH).record(group.len() as f64);
        let started = Instant::now();
        let result = with_retries(|| write(coordinator, instance, &kind, &group)).await;
        ::metrics::histogram!(metrics::OUTCOME_WRITE_DURATION, "kind" => label)
            .record(started.elapsed().as_secs_f64());
        ::metrics::counter!(metrics::OUTCOME_WRITES, "kind" => label, "result" => if result.is_ok() { "ok" } else { "error" })
            .increment(1);
        match result {
            Ok(batch) => {
                health.ok();
                // One record per distinct claim (the store answers a repeated claim once, with
                // its first outcome): every request for a claim gets that claim's record.
                let records: HashMap<Fence, Option<WorkState>> = batch
                    .items
                    .into_iter()
                    .map(|r| (r.fence, r.state))
                    .collect();
                // An item handed on goes to the first request for its claim only.
                let mut handed_off: HashMap<Fence, ClaimedWork> = batch
                    .handed_off
                    .into_iter()
                    .map(|h| (h.after, h.item))
                    .collect();
                for request in group {
                    let reply = match records.get(&request.fence) {
                        Some(state) => Ok(*state),
                        None => Err(format!(
                            "the {label} write answered nothing for item {}",
                            request.fence.id
                        )),
                    };
                    let next = handed_off.remove(&request.fence);
                    let _ = request.reply.send((reply, next));
                }
            }
            Err(e) => {
                tracing::warn!(
                    "writing {} {label} outcomes failed: {e}; their items will be reclaimed when the leases lapse",
                    group.len()
                );
                health.degraded(format_args!(
                    "writing {} {label} outcomes: {e} (their items are reclaimed when their leases lapse)",
                    group.len()
                ));
                let message = e.to_string();
                for request in group {
                    let _ = request.reply.send((Err(message.clone()), None));
                }
            }
        }
    }
}

async fn write(
    coordinator: &dyn WorkCoordinator,
    instance: InstanceId,
    kind: &Kind,
    group: &[Request],
) -> Result<OutcomeBatch, Error> {
    // Each claim once: a repeat would be answered (and applied) once anyway.
    let mut seen = HashSet::new();
    let group: Vec<&Request> = group.iter().filter(|r| seen.insert(r.fence)).collect();
    let fences = || group.iter().map(|r| r.fence).collect::<Vec<_>>();
    match kind {
        Kind::Complete => {
            // The queues whose completions asked for a hand-off, each once.
            let mut hand_off: Vec<HandOff> = Vec::new();
            for h in group.iter().filter_map(|r| r.hand_off.as_ref()) {
                if !hand_off.iter().any(|x| x.queue == h.queue) {
                    hand_off.push(h.clone());
                }
            }
            coordinator
                .complete_work(CompleteWorkParams {
                    instance,
                    items: fences(),
                    hand_off,
                })
                .await
        }
        Kind::Release(consume_attempt) => {
            coordinator
                .release_work(ReleaseWorkParams {
                    instance,
                    items: fences(),
                    consume_attempt: *consume_attempt,
                })
                .await
        }
        Kind::Fail => {
            let items = group
                .iter()
                .filter_map(|r| match &r.outcome {
                    Outcome::Fail { error, disposition } => Some(Failure {
                        fence: r.fence,
                        error: error.clone(),
                        disposition: *disposition,
                    }),
                    _ => None,
                })
                .collect();
            coordinator
                .fail_work(FailWorkParams { instance, items })
                .await
        }
    }
}

/// Retries a transient failure a few times (50, 100, 200 ms): an outcome that can't be
/// written means the work runs again.
async fn with_retries<F, Fut>(mut attempt: F) -> Result<OutcomeBatch, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<OutcomeBatch, Error>>,
{
    let mut delay = Duration::from_millis(50);
    for _ in 0..3 {
        match attempt().await {
            Err(e) if e.is_transient() => {
                tracing::debug!("outcome write failed, retrying in {delay:?}: {e}");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
    attempt().await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use workpump_coordinator::{
        ClaimWorkParams, EnqueueWorkParams, FakeCoordinator, Method, NewWork,
        RecordHeartbeatParams, RegisterQueueParams,
    };

    use super::*;

    /// The store answers a claim named twice in one statement once; both requests still get
    /// the claim's record, and the claim goes out once.
    #[tokio::test(start_paused = true)]
    async fn a_claim_recorded_twice_in_one_batch_is_written_once_and_both_requests_answered() {
        let fake = FakeCoordinator::new();
        fake.register_queue(RegisterQueueParams::new("q"))
            .await
            .unwrap();
        let me = InstanceId::new();
        fake.record_heartbeat(RecordHeartbeatParams {
            instance: me,
            host: "test".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: None,
            lock_grace: None,
            alive_lock: workpump_coordinator::AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .unwrap();
        fake.enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(1)), NewWork::new("q", json!(2))],
        })
        .await
        .unwrap();
        let claimed = fake
            .claim_work(ClaimWorkParams {
                instance: me,
                queues: vec!["q".into()],
                max_items: 2,
                lease: Duration::from_secs(60),
                async_commit: false,
            })
            .await
            .unwrap();
        let (a, b) = (claimed.items[0].fence, claimed.items[1].fence);
        let (recorder, writer) = Recorder::new(Arc::new(fake.clone()), 100, HealthReporter::new());
        let writer = tokio::spawn(writer);
        fake.clear_calls();
        let (first, second, other) = tokio::join!(
            recorder.record(me, a, Outcome::Complete),
            recorder.record(me, a, Outcome::Complete),
            recorder.record(me, b, Outcome::Complete),
        );
        assert_eq!(first, Ok(Some(WorkState::Completed)));
        assert_eq!(second, Ok(Some(WorkState::Completed)));
        assert_eq!(other, Ok(Some(WorkState::Completed)));
        let calls: Vec<usize> = fake
            .calls_of(Method::CompleteWork)
            .iter()
            .map(|c| c.items)
            .collect();
        assert_eq!(calls, vec![2], "one statement, each claim once");
        drop(recorder);
        writer.await.unwrap();
    }
}
