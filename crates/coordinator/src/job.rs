//! Typed jobs: a job's arguments name their kind and their defaults ([`JobArgs`]), and
//! anything that becomes a [`NewWork`] can be enqueued ([`IntoWork`]).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::types::NewWork;

/// The arguments of one kind of job. Implementing it is one line: the kind's name, which
/// the store records with every item so that several kinds share one queue (and its
/// concurrency), each run by its own handler.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use workpump_coordinator::JobArgs;
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail { to: String }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
/// }
///
/// // Defaults per kind, each optional:
/// #[derive(Serialize, Deserialize)]
/// struct Invoice { customer: u64, month: String }
///
/// impl JobArgs for Invoice {
///     const KIND: &'static str = "invoice";
///     const QUEUE: &'static str = "billing";
///     const PRIORITY: i16 = -1;
///     const MAX_ATTEMPTS: Option<i32> = Some(3);
///     // One unfinished invoice per customer and month.
///     fn unique_key(&self) -> Option<String> {
///         Some(format!("{}/{}", self.customer, self.month))
///     }
/// }
/// ```
///
/// The kind is part of the store's contract: items already enqueued carry it, so renaming a
/// kind strands them (keep a handler for the old name until they have drained). The payload
/// is the arguments as JSON (`serde_json`); a handler whose type no longer decodes an
/// enqueued payload sends that item to the dead letters, naming the serde error.
pub trait JobArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind's name, unique within its queue (1 to [`crate::MAX_KIND_CHARS`] characters,
    /// no control characters).
    const KIND: &'static str;
    /// The queue its items go to (and its handler serves). **Default: `default`.**
    const QUEUE: &'static str = "default";
    /// Lower runs first. **Default: 0.**
    const PRIORITY: i16 = 0;
    /// Attempts before an item becomes a dead letter. **Default: the queue's.**
    const MAX_ATTEMPTS: Option<i32> = None;

    /// The unique key of these arguments: while an item of the queue with this key is
    /// unfinished, enqueueing another writes nothing ([`NewWork::unique_key`]).
    /// **Default: none.**
    fn unique_key(&self) -> Option<String> {
        None
    }

    /// The ordering key of these arguments: items of the queue with one key run one at a
    /// time, in enqueue order ([`NewWork::ordering_key`]). **Default: none.**
    fn ordering_key(&self) -> Option<String> {
        None
    }

    /// These arguments as a [`NewWork`] with the kind's defaults, for per-item changes
    /// (`args.to_work()?.run_after(delay)`).
    fn to_work(&self) -> Result<NewWork> {
        let payload = serde_json::to_value(self).map_err(|e| {
            Error::InvalidArgument(format!(
                "job of kind {:?}: its arguments do not serialise to JSON: {e}",
                Self::KIND
            ))
        })?;
        let mut work = NewWork::new(Self::QUEUE, payload)
            .kind(Self::KIND)
            .priority(Self::PRIORITY);
        work.max_attempts = Self::MAX_ATTEMPTS;
        work.unique_key = self.unique_key();
        work.ordering_key = self.ordering_key();
        Ok(work)
    }
}

/// What can be enqueued: a [`NewWork`], or a job's arguments ([`JobArgs`]) with its kind's
/// defaults.
pub trait IntoWork {
    /// The item to enqueue.
    fn into_work(self) -> Result<NewWork>;
}

impl IntoWork for NewWork {
    fn into_work(self) -> Result<NewWork> {
        Ok(self)
    }
}

impl<A: JobArgs> IntoWork for A {
    fn into_work(self) -> Result<NewWork> {
        self.to_work()
    }
}
