//! Coalesced wake signals: the producers of one coordinator share their wakes.
//!
//! Every committed enqueue owes its queues a wake (docs/store.md, "Wake signals"), and a wake
//! covers an enqueue only when it is sent after that enqueue's commit. Producers that commit
//! while another producer's wake is on its way therefore need one more, but they can all share
//! it: at most one wake statement of a coordinator is in flight, and the one after it carries
//! every queue asked for meanwhile. A producer returns once a wake that started after its
//! request has been sent, so "the wake goes out before `enqueue_work` returns" still holds;
//! what changes is that 16 producers committing together send a few wake statements instead
//! of 16.
//!
//! The sender is whichever waiting producer finds no wake in flight; it sends on its own
//! connection, or on one from the pool when it waited first: a producer gives its connection
//! back before it waits, so that waiting producers never hold the connections a sender needs.
//! A sender whose future is dropped mid-send gives its queues back and leaves the sending to
//! the next waiter, so a cancelled caller never strands the others.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// One coordinator's wakes (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    state: Mutex<State>,
    /// Fired when a send ends (or its sender was dropped), for the waiting producers.
    ended: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Queues asked for and not yet taken by a send.
    pending: BTreeSet<String>,
    /// The number the next send will have (sends are numbered from 0 in the order they start).
    next: u64,
    /// Sends ended so far are those numbered below this.
    ended: u64,
    /// Whether a send is in flight.
    sending: bool,
}

impl Wakes {
    /// Asks for a wake of `queues` and returns once one that started after this call has
    /// been sent (by this caller through `send`, or by another's). `send` gets `held` back
    /// (`None` if this caller waited first) and the queues of everyone waiting; it reports its
    /// own failures (a wake is a hint: a failed one leaves the items to the claimers' next
    /// poll) and is called at most once. `held` is what the caller would send with (its
    /// connection): dropped before the caller waits for another's wake, so that waiting
    /// producers never hold what a sender needs (a pool's connections).
    pub(crate) async fn wake<H, F, Fut>(&self, queues: &[String], held: H, send: F)
    where
        F: FnOnce(Option<H>, Vec<String>) -> Fut,
        Fut: Future<Output = ()>,
    {
        if queues.is_empty() {
            return;
        }
        let mine = {
            let mut state = self.lock();
            state.pending.extend(queues.iter().cloned());
            state.next
        };
        let mut held = Some(held);
        let mut send = Some(send);
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let turn = {
                let mut state = self.lock();
                if state.ended > mine {
                    return;
                }
                if state.sending {
                    None
                } else {
                    state.sending = true;
                    let number = state.next;
                    state.next += 1;
                    Some((number, std::mem::take(&mut state.pending)))
                }
            };
            let Some((number, batch)) = turn else {
                held = None;
                ended.await;
                continue;
            };
            let mut sending = Sending {
                wakes: self,
                queues: Some(batch.clone()),
                number,
            };
            // A caller sends at most once: its own send covers it.
            if let Some(send) = send.take() {
                send(held.take(), batch.into_iter().collect()).await;
                sending.queues = None;
            }
            return;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The send in flight: when it ends, the next may start; dropped before it was sent (its
/// caller's future was dropped), its queues go back to the pending ones.
struct Sending<'a> {
    wakes: &'a Wakes,
    /// `Some` until the send completed.
    queues: Option<BTreeSet<String>>,
    number: u64,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.wakes.lock();
            state.sending = false;
            match self.queues.take() {
                Some(queues) => state.pending.extend(queues),
                None => state.ended = state.ended.max(self.number + 1),
            }
        }
        self.wakes.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::{sleep, Instant};

    use super::*;

    /// What the sends did: (started, ended, queues), on paused tokio time.
    type Log = Arc<Mutex<Vec<(Instant, Instant, Vec<String>)>>>;

    fn queues(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// Asks for a wake of `names` whose send (when this caller sends) takes 10 ms; returns
    /// when the caller asked and when it returned.
    async fn ask(wakes: &Wakes, log: &Log, names: &[&str]) -> (Instant, Instant) {
        let asked = Instant::now();
        wakes
            .wake(&queues(names), (), |_, batch| async move {
                let started = Instant::now();
                sleep(Duration::from_millis(10)).await;
                log.lock().unwrap().push((started, Instant::now(), batch));
            })
            .await;
        (asked, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_producer_sends_its_own_wake_at_once() {
        let (wakes, log) = (Wakes::default(), Log::default());
        let (asked, returned) = ask(&wakes, &log, &["a", "b"]).await;
        let sends = log.lock().unwrap().clone();
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].0, asked, "sent at once");
        assert_eq!(sends[0].2, queues(&["a", "b"]));
        assert_eq!(returned, sends[0].1, "returns when it was sent");
        // Nothing asked, nothing sent.
        let (wakes, log) = (Wakes::default(), Log::default());
        ask(&wakes, &log, &[]).await;
        assert!(log.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn producers_that_ask_during_a_send_share_the_next_one_and_wait_for_it() {
        let (wakes, log) = (Arc::new(Wakes::default()), Log::default());
        let first = {
            let (wakes, log) = (wakes.clone(), log.clone());
            tokio::spawn(async move { ask(&wakes, &log, &["a"]).await })
        };
        sleep(Duration::from_millis(2)).await;
        // Five more ask while the first send is in flight (2 to 6 ms; it started before they
        // asked, so it cannot cover them).
        let mut later = Vec::new();
        for name in ["b", "c", "b", "d", "a"] {
            let (wakes, log) = (wakes.clone(), log.clone());
            later.push(tokio::spawn(
                async move { ask(&wakes, &log, &[name]).await },
            ));
            sleep(Duration::from_millis(1)).await;
        }
        let first = first.await.unwrap();
        let later: Vec<_> = futures::future::join_all(later)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let log = log.lock().unwrap().clone();
        assert_eq!(log.len(), 2, "two sends for six producers: {log:?}");
        assert_eq!(log[0].2, queues(&["a"]));
        assert_eq!(log[1].2, queues(&["a", "b", "c", "d"]));
        assert_eq!(
            log[1].0, log[0].1,
            "the next send starts when the first ends"
        );
        assert_eq!(first.1, log[0].1);
        for (asked, returned) in later {
            assert!(
                log[1].0 >= asked,
                "the send that covers it started after it asked"
            );
            assert_eq!(returned, log[1].1, "returns once that send is over");
        }
    }

    /// What a producer would send with (its connection): records when it was dropped.
    struct Held(Arc<Mutex<Option<Instant>>>);

    impl Drop for Held {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(Instant::now());
        }
    }

    /// A producer of queue `name` holding `held`, sending for 10 ms; its send asserts whether
    /// it still had `held` (`sends_with_its_own`).
    fn producer(
        wakes: &Arc<Wakes>,
        name: &'static str,
        held: &Arc<Mutex<Option<Instant>>>,
        sends_with_its_own: bool,
    ) -> tokio::task::JoinHandle<()> {
        let (wakes, held) = (wakes.clone(), Held(Arc::clone(held)));
        tokio::spawn(async move {
            wakes
                .wake(&queues(&[name]), held, |held, _| async move {
                    assert_eq!(held.is_some(), sends_with_its_own, "{name}");
                    sleep(Duration::from_millis(10)).await;
                })
                .await
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_producer_lets_go_of_its_connection_and_a_sender_keeps_its_own() {
        let wakes = Arc::new(Wakes::default());
        let (first_held, second_held) = (Arc::default(), Arc::default());
        // The first sends with its own; the second, given back while it waited, without.
        let first = producer(&wakes, "a", &first_held, true);
        sleep(Duration::from_millis(2)).await;
        let second = producer(&wakes, "b", &second_held, false);
        sleep(Duration::from_millis(1)).await;
        let waiting_since = Instant::now();
        assert!(
            second_held.lock().unwrap().is_some(),
            "dropped as soon as it waits, with the first send still in flight"
        );
        assert!(
            first_held.lock().unwrap().is_none(),
            "the sender still holds its own"
        );
        first.await.unwrap();
        second.await.unwrap();
        assert!(second_held.lock().unwrap().unwrap() < waiting_since);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_dropped_mid_send_leaves_its_queues_to_the_next() {
        let (wakes, log) = (Arc::new(Wakes::default()), Log::default());
        let dropped = {
            let (wakes, log) = (wakes.clone(), log.clone());
            tokio::spawn(async move { ask(&wakes, &log, &["a"]).await })
        };
        sleep(Duration::from_millis(2)).await;
        let waiting = {
            let (wakes, log) = (wakes.clone(), log.clone());
            tokio::spawn(async move { ask(&wakes, &log, &["b"]).await })
        };
        sleep(Duration::from_millis(1)).await;
        dropped.abort();
        assert!(dropped.await.unwrap_err().is_cancelled());
        let (_, returned) = waiting.await.unwrap();
        let sends = log.lock().unwrap().clone();
        assert_eq!(
            sends.len(),
            1,
            "the dropped send never completed: {sends:?}"
        );
        assert_eq!(
            sends[0].2,
            queues(&["a", "b"]),
            "its queue went with the next send"
        );
        assert_eq!(returned, sends[0].1);
        // And the next producer is not left waiting on a send that will never end.
        let (asked, returned) = ask(&wakes, &log, &["c"]).await;
        assert_eq!(returned - asked, Duration::from_millis(10));
    }
}
