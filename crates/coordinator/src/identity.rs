//! [`Identity`]: which instance this process currently is.

use std::sync::Arc;

use tokio::sync::watch;

use crate::types::InstanceId;

/// The instance id this process currently runs as, shared by the workers of one host.
///
/// It starts fresh for every start of the process (never persisted), so a restarted pod never
/// inherits a dead incarnation's identity. When the heartbeat worker learns that the store
/// reaped this instance (eviction), it calls [`Identity::evicted`]: a new id is minted and
/// every subscriber sees the change. Whoever dispatched work under the old id must treat every
/// lease of it as lost (cancel the handlers, record nothing); the next heartbeat registers the
/// new id afresh.
///
/// Registration has one home: the heartbeat worker. Its first recorded beat of an id calls
/// [`Identity::mark_registered`], and whoever must not act before the store knows the
/// instance (the claim worker, before every claim) waits for that with
/// [`Identity::registered`] or watches it with [`Identity::subscribe_registered`].
#[derive(Clone, Debug)]
pub struct Identity {
    tx: Arc<watch::Sender<Generation>>,
    /// The id whose first heartbeat the store recorded (see [`Identity::mark_registered`]).
    registered: Arc<watch::Sender<Option<InstanceId>>>,
}

/// One incarnation of the process in the store: an id and how many evictions came before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The instance id of this incarnation.
    pub instance: InstanceId,
    /// 0 at start, + 1 per eviction.
    pub evictions: u64,
}

impl Default for Identity {
    fn default() -> Self {
        Self::new()
    }
}

impl Identity {
    /// A fresh identity with a new random instance id.
    pub fn new() -> Self {
        Self::with_instance(InstanceId::new())
    }

    /// An identity starting as `instance` (tests, or an embedder that names its instances).
    pub fn with_instance(instance: InstanceId) -> Self {
        let (tx, _) = watch::channel(Generation {
            instance,
            evictions: 0,
        });
        Identity {
            tx: Arc::new(tx),
            registered: Arc::new(watch::Sender::new(None)),
        }
    }

    /// The current instance id.
    pub fn current(&self) -> InstanceId {
        self.tx.borrow().instance
    }

    /// The current incarnation.
    pub fn generation(&self) -> Generation {
        *self.tx.borrow()
    }

    /// Watches for evictions (each one changes the value).
    pub fn subscribe(&self) -> watch::Receiver<Generation> {
        self.tx.subscribe()
    }

    /// Records that the store has recorded a heartbeat of `instance` (its row exists, or did).
    /// From then on a heartbeat for it is not a registration: a missing row means it was
    /// reaped (`RecordHeartbeatParams::registering`).
    /// Subscribers of [`subscribe_registered`](Self::subscribe_registered) see the change, and
    /// [`registered`](Self::registered) returns once `instance` is the current id.
    pub fn mark_registered(&self, instance: InstanceId) {
        self.registered.send_if_modified(|r| {
            let changed = *r != Some(instance);
            *r = Some(instance);
            changed
        });
    }

    /// Whether the store has recorded a heartbeat of `instance` (the current id, normally).
    pub fn is_registered(&self, instance: InstanceId) -> bool {
        *self.registered.borrow() == Some(instance)
    }

    /// Watches the id whose heartbeat the store recorded last (`None` before the first). It
    /// may be a former id: compare it with [`current`](Self::current), or use
    /// [`registered`](Self::registered).
    pub fn subscribe_registered(&self) -> watch::Receiver<Option<InstanceId>> {
        self.registered.subscribe()
    }

    /// Waits until the current incarnation is registered (the heartbeat worker recorded a
    /// beat of it) and returns its id; at once when it already is. After an eviction it waits
    /// for the fresh id's registration: a registration of a former id does not count. Never
    /// polls: it wakes on a registration or an eviction.
    pub async fn registered(&self) -> InstanceId {
        let mut generations = self.tx.subscribe();
        let mut registered = self.registered.subscribe();
        loop {
            let current = generations.borrow_and_update().instance;
            if *registered.borrow_and_update() == Some(current) {
                return current;
            }
            // Both senders live as long as `self`: neither `changed` can fail here.
            tokio::select! {
                _ = generations.changed() => {}
                _ = registered.changed() => {}
            }
        }
    }

    /// Records that `instance` was evicted and mints a new id, unless the identity already
    /// moved on from it. Returns the current instance id afterwards.
    pub fn evicted(&self, instance: InstanceId) -> InstanceId {
        self.tx.send_if_modified(|g| {
            if g.instance == instance {
                g.instance = InstanceId::new();
                g.evictions += 1;
                true
            } else {
                false
            }
        });
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_id_whose_beat_was_recorded_is_registered() {
        let identity = Identity::new();
        let first = identity.current();
        assert!(!identity.is_registered(first));
        identity.mark_registered(first);
        assert!(identity.clone().is_registered(first));
        let second = identity.evicted(first);
        assert!(!identity.is_registered(second));
    }

    #[tokio::test(start_paused = true)]
    async fn registered_waits_for_the_current_id_and_not_a_former_one() {
        let identity = Identity::new();
        let first = identity.current();
        let waiting = tokio::spawn({
            let identity = identity.clone();
            async move { identity.registered().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        identity.mark_registered(first);
        assert_eq!(waiting.await.unwrap(), first);
        // At once when it already is.
        assert_eq!(identity.registered().await, first);

        let second = identity.evicted(first);
        let waiting = tokio::spawn({
            let identity = identity.clone();
            async move { identity.registered().await }
        });
        // A late registration of the former id does not count.
        identity.mark_registered(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut watch = identity.subscribe_registered();
        identity.mark_registered(second);
        assert_eq!(waiting.await.unwrap(), second);
        assert!(watch.has_changed().unwrap());
        assert_eq!(*watch.borrow_and_update(), Some(second));
    }

    #[test]
    fn an_eviction_mints_a_new_id_once() {
        let identity = Identity::new();
        let first = identity.current();
        let mut rx = identity.subscribe();
        let second = identity.evicted(first);
        assert_ne!(first, second);
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().evictions, 1);
        // A late report about the old id changes nothing.
        assert_eq!(identity.evicted(first), second);
        assert!(!rx.has_changed().unwrap());
    }
}
