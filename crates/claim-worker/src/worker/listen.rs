//! The wake listener: a LISTEN session whose notifications end a queue's wait, and the
//! NOTIFY gate that tells the poll loops whether to rely on it.

use super::*;

/// Keeps a LISTEN connection and turns its events into wakes and gate states.
pub(super) async fn listen_loop(run: Arc<Run>, stop: CancellationToken) {
    let shared = &run.shared;
    let mut delay = shared.config.base();
    let health = shared.health.part("listener");
    let base = shared.config.base();
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = shared.coordinator.listen(ListenParams::default()) => opened,
        };
        let mut listener = match opened {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("LISTEN unavailable, polling instead: {e}");
                health.degraded(format_args!(
                    "LISTEN unavailable, polling every {base:?} instead: {e}"
                ));
                run.set_gate(Gate::Unavailable);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(shared.config.max());
                continue;
            }
        };
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = listener.next_event() => event,
            };
            match event {
                Ok(ListenEvent::Connected) => {
                    delay = shared.config.base();
                    health.ok();
                    run.set_gate(Gate::Healthy);
                    // Anything sent while it was down was missed: catch up.
                    ::metrics::counter!(metrics::WAKES, "source" => "reconnect").increment(1);
                    shared.waker.wake_all();
                }
                Ok(ListenEvent::Wake { queue }) => {
                    ::metrics::counter!(metrics::WAKES, "source" => "notify").increment(1);
                    if let Some(n) = shared.waker.queues.get(&queue) {
                        n.notify_one();
                    }
                }
                Ok(ListenEvent::Disconnected) => {
                    health.degraded(format_args!(
                        "the LISTEN connection was lost; polling every {base:?} until it is back"
                    ));
                    run.set_gate(Gate::Unavailable);
                }
                Err(e) => {
                    tracing::debug!("LISTEN reconnect failed: {e}");
                    health.degraded(format_args!(
                        "LISTEN reconnect failed, polling every {base:?} instead: {e}"
                    ));
                    run.set_gate(Gate::Unavailable);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(shared.config.max());
                }
            }
        }
    }
}
