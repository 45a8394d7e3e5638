//! Dispatch: one item on its own task under its lease — the handler's run, what to record
//! for it ([`decide`]), and the write, with the lease kept renewed until it is written.

use super::*;

/// Runs one claimed item: lease, handler, outcome.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_item(
    run: Arc<Run>,
    q: Arc<QueueRuntime>,
    item: ClaimedWork,
    instance: InstanceId,
    sent_at: Instant,
    permit: OwnedSemaphorePermit,
    slot_freed: Arc<Notify>,
    recorder: Recorder,
) {
    let shared = &run.shared;
    let fence = item.fence;
    let span = crate::trace::attempt_span(&item, instance);
    let attempt = (item.attempt, item.max_attempts);
    let lease = shared
        .leases
        .track(instance, fence, sent_at, q.settings.lease, &run.root);
    if let Ok(mut m) = run.in_flight.lock() {
        m.insert(fence, lease.clone());
    }
    ::metrics::gauge!(metrics::IN_FLIGHT, "queue" => q.name.clone()).increment(1.0);
    // An eviction or a drain that began while this item was being claimed applies to it too.
    if instance != shared.identity.current() {
        lease.cancel(CancelReason::Evicted);
    }

    let outcome = if lease.is_expired() {
        // The claim took so long that its lease can no longer be trusted: never start.
        count(&q.name, "rejected_expired");
        Some(Outcome::Release {
            consume_attempt: false,
        })
    } else if lease.token().is_cancelled() {
        None
    } else {
        execute(&run, &q, item, instance, &lease, &span).await
    };

    if let Some(outcome) = outcome {
        // Keep the lease renewed until the outcome is written.
        let guard = lease.guard();
        tokio::pin!(guard);
        let write = recorder.record(instance, fence, outcome.clone());
        tokio::pin!(write);
        let mut guard_done = lease.token().is_cancelled();
        let recorded = loop {
            tokio::select! {
                r = &mut write => break r,
                _ = &mut guard, if !guard_done => guard_done = true,
            }
        };
        count(&q.name, outcome_label(&outcome, &recorded));
        span.in_scope(|| log_outcome(&q.name, fence, attempt, &outcome, &recorded));
    }

    lease.dispose();
    if let Ok(mut m) = run.in_flight.lock() {
        m.remove(&fence);
    }
    ::metrics::gauge!(metrics::IN_FLIGHT, "queue" => q.name.clone()).decrement(1.0);
    drop(permit);
    slot_freed.notify_one();
}

/// The handler's run, and what to record for it (`None`: nothing, the lease is gone).
async fn execute(
    run: &Run,
    q: &QueueRuntime,
    item: ClaimedWork,
    instance: InstanceId,
    lease: &Arc<dyn TrackedLease>,
    span: &tracing::Span,
) -> Option<Outcome> {
    let shared = &run.shared;
    let attempt = item.attempt;
    let handler = q.handlers.get(&q.name, item.kind.as_deref());
    let ctx = Arc::new(JobContext {
        fence: item.fence,
        instance,
        queue: q.name.clone(),
        kind: item.kind,
        metadata: item.metadata,
        attempt,
        max_attempts: item.max_attempts,
        created_at: item.created_at,
        checkpoint: item.checkpoint,
        lease: lease.clone(),
        store: JobStore::Claimed {
            coordinator: shared.coordinator.clone(),
            pg: shared.pg.clone(),
        },
        completed_in_transaction: Default::default(),
    });
    let started = Instant::now();
    let handler = async {
        match handler {
            Ok(handler) => handler.call(item.payload, ctx.clone()).await,
            // No handler for its kind here: a failed attempt naming the kind, retried.
            Err(missing) => Ok(Err(JobError::retry(missing))),
        }
    };
    let handler =
        AssertUnwindSafe(tracing::Instrument::instrument(handler, span.clone())).catch_unwind();
    tokio::pin!(handler);
    let guard = lease.guard();
    tokio::pin!(guard);
    let mut guard_done = false;
    let mut wind_down: Option<Instant> = None;
    let finished = loop {
        tokio::select! {
            r = &mut handler => break Some(r),
            _ = &mut guard, if !guard_done => {
                guard_done = true;
                let reason = lease.cancel_reason();
                if let Some(r) = reason {
                    ::metrics::counter!(metrics::HANDLER_CANCELLED, "queue" => q.name.clone(), "reason" => r.label())
                        .increment(1);
                }
                wind_down = match reason {
                    // Draining (after the soft stop): the handler may use the whole hard
                    // drain timeout.
                    Some(CancelReason::Shutdown) => None,
                    // Someone else may be running it already: stop now.
                    Some(CancelReason::LeaseLost | CancelReason::Evicted) => Some(Instant::now()),
                    // The lease still has its grace: half of it to wind down.
                    _ => Some(Instant::now() + q.settings.lease.grace / 2),
                };
            }
            _ = sleep_until_opt(wind_down) => break None,
            _ = run.drain_deadline.cancelled() => break None,
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    let ended = match finished {
        None => {
            // Abandoned: the future is dropped here, at its current await point.
            count(&q.name, "abandoned");
            Ended::Abandoned
        }
        Some(Err(panic)) => {
            // Logged with the outcome it leads to (a failed attempt naming the panic).
            Ended::Panicked(panic_message(&panic))
        }
        Some(Ok(Err(decode))) => Ended::Undecodable(decode),
        Some(Ok(Ok(Ok(())))) => {
            let in_transaction = ctx.completed_in_transaction.load(Ordering::Acquire);
            if in_transaction {
                count(&q.name, "completed");
            }
            Ended::Succeeded { in_transaction }
        }
        Some(Ok(Ok(Err(e)))) => Ended::Failed(e),
    };
    ::metrics::histogram!(metrics::HANDLER_DURATION, "queue" => q.name.clone(), "result" => ended.label())
        .record(elapsed);
    decide(
        ended,
        lease.cancel_reason(),
        q.settings.backoff.delay(attempt),
    )
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// A failed attempt is a warning, a dead letter an error, each with the error recorded.
/// Logged inside the attempt's span, so its fields (kind, trace) come along.
fn log_outcome(
    queue: &str,
    fence: Fence,
    (attempt, max_attempts): (i32, i32),
    outcome: &Outcome,
    recorded: &crate::recorder::Recorded,
) {
    use workpump_coordinator::WorkState::*;
    let id = fence.id;
    match (outcome, recorded) {
        (Outcome::Fail { error, .. }, Ok(Some(Available | Scheduled))) => tracing::warn!(
            "item {id} of queue {queue:?} failed attempt {attempt} of {max_attempts}; it will be retried: {error}"
        ),
        (Outcome::Fail { error, .. }, Ok(Some(Dead))) => tracing::error!(
            "item {id} of queue {queue:?} is a dead letter after attempt {attempt} of {max_attempts}: {error}"
        ),
        (Outcome::Fail { error, .. }, Ok(Some(Cancelled))) => {
            tracing::info!("item {id} of queue {queue:?} was cancelled: {error}")
        }
        // An outcome the store could not take is logged by the recorder, once per batch.
        _ => {}
    }
}

fn outcome_label(outcome: &Outcome, recorded: &crate::recorder::Recorded) -> &'static str {
    use workpump_coordinator::WorkState::*;
    match recorded {
        Err(_) => "unrecorded",
        Ok(None) => "fenced_out",
        Ok(Some(state)) => match (outcome, state) {
            (Outcome::Release { .. }, Available) => "released",
            (_, Completed) => "completed",
            (_, Available | Scheduled) => "retried",
            (_, Dead) => "dead",
            (_, Cancelled) => "cancelled",
            (_, Running) => "released",
        },
    }
}

fn count(queue: &str, outcome: &'static str) {
    ::metrics::counter!(metrics::ITEMS, "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}
