//! [`Identity`]: which instance this process currently is.

use std::sync::{Arc, Mutex};

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
#[derive(Clone, Debug)]
pub struct Identity {
    tx: Arc<watch::Sender<Generation>>,
    /// The id whose first heartbeat the store recorded (see [`Identity::mark_registered`]).
    registered: Arc<Mutex<Option<InstanceId>>>,
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
            registered: Arc::new(Mutex::new(None)),
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
    pub fn mark_registered(&self, instance: InstanceId) {
        *self.registered.lock().unwrap_or_else(|p| p.into_inner()) = Some(instance);
    }

    /// Whether the store has recorded a heartbeat of `instance` (the current id, normally).
    pub fn is_registered(&self, instance: InstanceId) -> bool {
        *self.registered.lock().unwrap_or_else(|p| p.into_inner()) == Some(instance)
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
