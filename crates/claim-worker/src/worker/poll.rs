//! One poll loop per queue: claims no more than the queue's free handler slots, hands each
//! item to dispatch, and waits adaptively between claims ([`wait_after`]), or, when the
//! store throttled the queue (its fleet-wide flow limits), as [`throttle_wait`] says.

use super::*;

/// One queue's poll loop.
pub(super) async fn claim_loop(
    run: Arc<Run>,
    q: Arc<QueueRuntime>,
    stop: CancellationToken,
    dispatch: TaskTracker,
    recorder: Recorder,
) {
    let shared = &run.shared;
    let (slots, slot_freed) = run.slots[&q.name].clone();
    let mut registered = run.registered.subscribe();
    let mut gate = run.gate.subscribe();
    let mut empty: u32 = 0;
    let mut unknown_reported = false;
    let queue = q.name.clone();
    let health = shared.health.queue(&queue);
    loop {
        // Registered under the current identity?
        let instance = tokio::select! {
            _ = stop.cancelled() => return,
            r = registered.wait_for(|r| r.is_some()) => match r {
                Ok(r) => r.expect("waited for Some"),
                Err(_) => return,
            },
        };
        if instance != shared.identity.current() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = registered.changed() => continue,
            }
        }
        // Free slots?
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = slot_freed.notified() => continue,
            }
        }
        let want = (free as u32).min(shared.config.max_items_per_claim);
        // This poll answers every wake signal received so far: drop a stored one, so a burst
        // is one poll. (A signal that arrives while the claim is in flight is kept: the claim
        // may not have seen that work.)
        let _ = q.wake.notified().now_or_never();
        let sent_at = Instant::now();
        let result = shared
            .coordinator
            .claim_work(ClaimWorkParams {
                instance,
                queues: vec![queue.clone()],
                max_items: want,
                lease: q.settings.lease.lease,
                async_commit: q.settings.async_commit,
            })
            .await;
        ::metrics::histogram!(metrics::CLAIM_DURATION, "queue" => queue.clone())
            .record(sent_at.elapsed().as_secs_f64());
        if !matches!(result, Err(Error::UnknownQueue(_))) {
            unknown_reported = false;
        }
        let mut throttle = None;
        let full = match result {
            Ok(out) => {
                health.ok();
                let n = out.items.len();
                for t in &out.throttles {
                    ::metrics::counter!(
                        metrics::THROTTLED,
                        "queue" => t.queue.clone(),
                        "reason" => t.reason.as_str()
                    )
                    .increment(1);
                }
                throttle = out.throttles.iter().find(|t| t.queue == queue).cloned();
                report_orphans_ended(&out.orphans_ended);
                let result = match (n, &throttle) {
                    (0, Some(_)) => "throttled",
                    (0, None) => "empty",
                    _ => "items",
                };
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => result)
                    .increment(1);
                match (n, &throttle) {
                    (0, None) => empty = empty.saturating_add(1),
                    // A throttled poll is not empty: work is waiting for the limit, and the
                    // backoff must not grow while it does (nor be reset: it was not served).
                    (0, Some(_)) => {}
                    _ => {
                        empty = 0;
                        ::metrics::histogram!(metrics::BATCH_SIZE, "queue" => queue.clone())
                            .record(n as f64);
                    }
                }
                for item in out.items {
                    let kind = if item.reclaimed { "reclaimed" } else { "new" };
                    ::metrics::counter!(metrics::CLAIMED, "queue" => queue.clone(), "kind" => kind)
                        .increment(1);
                    if let Some(lag) = item.pickup_lag {
                        ::metrics::histogram!(metrics::PICKUP_LAG, "queue" => queue.clone())
                            .record(lag.as_secs_f64());
                    }
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        // Never happens: this loop is the only taker and claimed <= free.
                        tracing::error!("no free slot for claimed item {}", item.fence.id);
                        break;
                    };
                    dispatch.spawn(run_item(
                        run.clone(),
                        q.clone(),
                        item,
                        instance,
                        sent_at,
                        permit,
                        slot_freed.clone(),
                        recorder.clone(),
                    ));
                }
                out.has_more && n as u32 == want
            }
            Err(Error::NotRegistered(i)) => {
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "error")
                    .increment(1);
                tracing::warn!("claiming as {i}: this instance is no longer registered");
                shared.identity.evicted(i);
                continue;
            }
            Err(Error::UnknownQueue(_)) => {
                // The host registers its handler queues before claiming, so this takes a
                // registration that was lost (or a store of one's own): say it once, plainly,
                // and keep polling with backoff until the queue exists.
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "unknown_queue")
                    .increment(1);
                health.degraded(format_args!(
                    "claiming from {queue:?}: the store says this queue is not registered"
                ));
                if !unknown_reported {
                    tracing::error!(
                        "claiming from {queue:?}: the store says this queue is not registered, so \
                         nothing of it can be claimed; register it (register_queue), as the host \
                         does at start. Polling on with backoff until it is."
                    );
                    unknown_reported = true;
                }
                empty = empty.saturating_add(1);
                false
            }
            Err(e) => {
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "error")
                    .increment(1);
                tracing::warn!("claiming from {queue:?} failed: {e}");
                health.degraded(format_args!("claiming from {queue:?}: {e}"));
                empty = empty.saturating_add(1);
                false
            }
        };
        if full {
            // The drain hint: more is waiting; poll again at once.
            continue;
        }
        if let Some(t) = throttle {
            let ThrottleWait { wait, on_signals } = throttle_wait(&t, &shared.config);
            ::metrics::histogram!(metrics::POLL_WAIT, "queue" => queue.clone())
                .record(wait.as_secs_f64());
            if on_signals {
                // The running limit: a slot freed by this instance, a wake signal (an item
                // ended elsewhere may send none, so also the base cadence at most).
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                    _ = slot_freed.notified() => {}
                    _ = q.wake.notified() => {}
                }
            } else {
                // The rate limit: nothing is claimable before the next token, whatever wakes.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            continue;
        }
        let wait = wait_after(empty, *gate.borrow_and_update(), &shared.config);
        if let Some(w) = wait {
            ::metrics::histogram!(metrics::POLL_WAIT, "queue" => queue.clone())
                .record(w.as_secs_f64());
        }
        let sleep = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep => {}
            _ = q.wake.notified() => {}
            // The gate flipping re-decides the wait (down: back to the tight base).
            _ = gate.changed() => {}
        }
    }
}

/// Counts and logs the orphans a claim ended: as the maintenance sweep does those it ends,
/// every dead letter is an error in the log.
fn report_orphans_ended(ended: &workpump_coordinator::DeadLetterExpiredOutcome) {
    for c in &ended.dead {
        ::metrics::counter!(metrics::ORPHANS_ENDED, "queue" => c.queue.clone(), "state" => "dead")
            .increment(c.items);
        tracing::error!(
            queue = %c.queue,
            "{}",
            workpump_coordinator::DeadLetterExpiredOutcome::dead_letter_message(c)
        );
    }
    for c in &ended.cancelled {
        ::metrics::counter!(metrics::ORPHANS_ENDED, "queue" => c.queue.clone(), "state" => "cancelled")
            .increment(c.items);
        tracing::info!(
            queue = %c.queue,
            "{} items of queue {:?} ended cancelled: a cancel was requested and the lease of \
             their attempt expired",
            c.items,
            c.queue
        );
    }
}
