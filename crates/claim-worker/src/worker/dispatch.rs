//! Dispatch: one item on its own task under its lease — the claimed hooks and the handler's
//! run, what to record for it ([`decide`]), the write, with the lease kept renewed until it
//! is written, and the ended hooks with the ending derived from what was recorded.

use super::*;

/// Runs one claimed item in its slot: lease, hooks, handler, outcome; then, in the same slot,
/// each item its completion was handed (its ordering key's next, docs/ordering.md).
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
    // One state machine for the whole chain: a nested future per item would be moved (copied)
    // into this one at each item, several kilobytes each time.
    let mut item = item;
    let mut sent_at = sent_at;
    let mut handed_on = false;
    loop {
        let shared = &run.shared;
        let fence = item.fence;
        let span = crate::trace::attempt_span(&item, instance);
        let attempt = (item.attempt, item.max_attempts);
        let hooked = Attempt::new(&q.name, item.kind.as_deref(), fence, instance, attempt);
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
        } else if handed_on && run.stop_claiming.is_cancelled() {
            // Handed on by a completion written as the drain began: given back, never started.
            lease.cancel(CancelReason::Shutdown);
        }

        let expired_before_start = lease.is_expired();
        let (outcome, unrecorded) = if expired_before_start {
            // The claim took so long that its lease can no longer be trusted: never start.
            count(&q.name, "rejected_expired");
            claimed_unguarded(&shared.hooks, &hooked, &q, &span).await;
            (
                Some(Outcome::Release {
                    consume_attempt: false,
                }),
                Ending::Unavailable(UnavailableReason::ExpiredBeforeStart),
            )
        } else if lease.token().is_cancelled() {
            // Turned away before it started (evicted, lease lost, the drain): what an abandoned
            // run with that reason records — nothing for a lost lease, a release for the drain.
            claimed_unguarded(&shared.hooks, &hooked, &q, &span).await;
            let reason = lease.cancel_reason();
            (
                decide(
                    Ended::Abandoned,
                    reason,
                    q.settings.backoff.delay(item.attempt),
                ),
                unrecorded_ending(reason, false),
            )
        } else {
            execute(&run, &q, item, instance, &lease, &span, &hooked).await
        };

        let mut handed = None;
        let mut write_sent = Instant::now();
        let ending = match outcome {
            Some(outcome) => {
                // Keep the lease renewed until the outcome is written.
                let guard = lease.guard();
                tokio::pin!(guard);
                // A completion takes its ordering key's next item, unless this worker stops
                // claiming (docs/ordering.md, "Hand-off").
                let hand_off = (outcome == Outcome::Complete
                    && !run.stop_claiming.is_cancelled()
                    && instance == shared.identity.current())
                .then(|| HandOff {
                    queue: q.name.clone(),
                    lease: q.settings.lease.lease,
                });
                write_sent = Instant::now();
                let write = async {
                    match outcome {
                        Outcome::Complete => recorder.complete(instance, fence, hand_off).await,
                        _ => (
                            recorder.record(instance, fence, outcome.clone()).await,
                            None,
                        ),
                    }
                };
                tokio::pin!(write);
                let mut guard_done = lease.token().is_cancelled();
                let (recorded, next) = loop {
                    tokio::select! {
                        r = &mut write => break r,
                        _ = &mut guard, if !guard_done => guard_done = true,
                    }
                };
                handed = next;
                count(&q.name, outcome_label(&outcome, &recorded));
                span.in_scope(|| log_outcome(&q.name, fence, attempt, &outcome, &recorded));
                if expired_before_start {
                    unrecorded
                } else {
                    recorded_ending(&outcome, recorded)
                }
            }
            None => unrecorded,
        };

        lease.dispose();
        if let Ok(mut m) = run.in_flight.lock() {
            m.remove(&fence);
        }
        ::metrics::gauge!(metrics::IN_FLIGHT, "queue" => q.name.clone()).decrement(1.0);
        ended_hooks(&shared.hooks, &hooked, &ending, &q, &span).await;
        match handed {
            Some(next) => {
                ::metrics::counter!(metrics::CLAIMED, "queue" => q.name.clone(), "kind" => "handed_off")
                .increment(1);
                item = next;
                sent_at = write_sent;
                handed_on = true;
            }
            None => break,
        }
    }
    drop(permit);
    slot_freed.notify_one();
}

/// The claimed hooks of an attempt turned away before it starts: no lease left to guard
/// them, so each is bounded by the lease grace instead; their results are ignored.
async fn claimed_unguarded(
    hooks: &HookList,
    attempt: &Attempt,
    q: &QueueRuntime,
    span: &tracing::Span,
) {
    let bound = q.settings.lease.grace;
    for hook in hooks.iter() {
        let call = AssertUnwindSafe(hook.claimed(attempt)).catch_unwind();
        match tokio::time::timeout(bound, tracing::Instrument::instrument(call, span.clone()))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(panic)) => span.in_scope(|| {
                tracing::error!(
                    "a claimed hook panicked for item {} attempt {} in queue {:?} (turned away before it started): {}",
                    attempt.id(),
                    attempt.attempt(),
                    attempt.queue(),
                    panic_message(&panic)
                )
            }),
            Err(_) => span.in_scope(|| {
                tracing::warn!(
                    "a claimed hook for item {} attempt {} in queue {:?} (turned away before it started) ran past {bound:?} and was dropped",
                    attempt.id(),
                    attempt.attempt(),
                    attempt.queue()
                )
            }),
        }
    }
}

/// Every ended hook, in order, each bounded by the lease grace, its panics logged.
async fn ended_hooks(
    hooks: &HookList,
    attempt: &Attempt,
    ending: &Ending,
    q: &QueueRuntime,
    span: &tracing::Span,
) {
    let bound = q.settings.lease.grace;
    for hook in hooks.iter() {
        let call = AssertUnwindSafe(hook.ended(attempt, ending)).catch_unwind();
        match tokio::time::timeout(bound, tracing::Instrument::instrument(call, span.clone()))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(panic)) => span.in_scope(|| {
                tracing::error!(
                    "an ended hook panicked for item {} attempt {} in queue {:?} ({ending}): {}",
                    attempt.id(),
                    attempt.attempt(),
                    attempt.queue(),
                    panic_message(&panic)
                )
            }),
            Err(_) => span.in_scope(|| {
                tracing::warn!(
                    "an ended hook for item {} attempt {} in queue {:?} ({ending}) ran past {bound:?} (the lease grace) and was dropped",
                    attempt.id(),
                    attempt.attempt(),
                    attempt.queue()
                )
            }),
        }
    }
}

/// The ending of an attempt for which nothing was recorded: completed in the handler's own
/// transaction, or its lease (or instance) gone.
fn unrecorded_ending(reason: Option<CancelReason>, in_transaction: bool) -> Ending {
    if in_transaction {
        return Ending::Completed;
    }
    match reason {
        Some(CancelReason::Evicted) => Ending::Unavailable(UnavailableReason::Evicted),
        _ => Ending::Unavailable(UnavailableReason::LeaseLost),
    }
}

/// The ending of a recorded outcome, from the state it left the item in (as
/// [`outcome_label`] counts it).
fn recorded_ending(outcome: &Outcome, recorded: crate::recorder::Recorded) -> Ending {
    use workpump_coordinator::WorkState::*;
    let error = || match outcome {
        Outcome::Fail { error, .. } => error.clone(),
        Outcome::Complete => "completed".to_owned(),
        Outcome::Release { .. } => "released".to_owned(),
    };
    match recorded {
        Err(error) => Ending::Unavailable(UnavailableReason::NotRecorded { error }),
        Ok(None) => Ending::Unavailable(UnavailableReason::LeaseLost),
        Ok(Some(state)) => match (outcome, state) {
            (Outcome::Release { .. }, Available) => Ending::Released,
            (_, Completed) => Ending::Completed,
            (_, Available | Scheduled) => Ending::Failed { error: error() },
            (_, Dead) => Ending::DeadLettered { error: error() },
            (_, Cancelled) => Ending::Cancelled { error: error() },
            // Running, blocked (no outcome sends an item there: only an enqueue or a retry
            // behind its ordering key's head does) or a state a later store adds: were a
            // store to say so, the item waits unfinished.
            _ => Ending::Released,
        },
    }
}

/// The claimed hooks, the started hooks and the handler's run, under the lease guard; what to
/// record for it (`None`: nothing, the lease is gone or the handler completed the item in its
/// transaction) and the ending when nothing is recorded.
async fn execute(
    run: &Run,
    q: &QueueRuntime,
    item: ClaimedWork,
    instance: InstanceId,
    lease: &Arc<dyn TrackedLease>,
    span: &tracing::Span,
    hooked: &Attempt,
) -> (Option<Outcome>, Ending) {
    let shared = &run.shared;
    let attempt = item.attempt;
    let service = q
        .handlers
        .get(item.kind.as_deref())
        .unwrap_or(&q.missing)
        .clone();
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
    let job = Job::new(item.payload, ctx.clone());
    let hooks = &shared.hooks;
    let handler = async move {
        for hook in hooks.iter() {
            match AssertUnwindSafe(hook.claimed(hooked)).catch_unwind().await {
                Ok(Ok(())) => {}
                // The attempt fails as the handler's error would; the handler never runs.
                Ok(Err(e)) => return Ok(Err(e)),
                Err(panic) => {
                    return Ok(Err(JobError::retry(format!(
                        "a claimed hook panicked: {}",
                        panic_message(&panic)
                    ))))
                }
            }
        }
        for hook in hooks.iter() {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| hook.started(hooked)))
            {
                tracing::error!(
                    "a started hook panicked for item {} attempt {} in queue {:?}: {}",
                    hooked.id(),
                    hooked.attempt(),
                    hooked.queue(),
                    panic_message(&panic)
                );
            }
        }
        // A clone per attempt, made ready here: waiting for a layer (a concurrency limit)
        // counts toward max_duration and is interrupted by lease loss.
        let mut service = service;
        let ready = service.ready().await?;
        ready.call(job).await
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
        // The handler's service (a middleware) failed: a retried failure naming the error.
        Some(Ok(Err(e))) => Ended::Failed(service_error(e)),
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
    let reason = lease.cancel_reason();
    let in_transaction = ctx.completed_in_transaction.load(Ordering::Acquire);
    (
        decide(ended, reason, q.settings.backoff.delay(attempt)),
        unrecorded_ending(reason, in_transaction),
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
            // Running, blocked, or a state a later store adds (see recorded_ending).
            _ => "released",
        },
    }
}

fn count(queue: &str, outcome: &'static str) {
    ::metrics::counter!(metrics::ITEMS, "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}
