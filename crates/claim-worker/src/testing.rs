//! Jobs built outside a claim, for unit tests of handlers (feature `testing`; the
//! `workpump-test` crate re-exports it with a runner and outcome to match).
//!
//! [`JobBuilder`] makes a [`Job<T>`] with the payload and whatever attempt, ids, queue, kind,
//! timestamps, checkpoint and metadata a test needs, and a [`JobProbe`] that stands where the
//! store and the lease-renewal worker stand in production: it fires the job's cancellation
//! token with a [`CancelReason`] of the test's choosing (an operator's cancel, a shutdown, a
//! lost lease) and records every checkpoint the handler saves. Nothing touches a database:
//! [`Job::begin_transaction`] answers an error saying so.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use workpump_claim_worker::testing::JobBuilder;
//! use workpump_coordinator::{CancelReason, JobArgs};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Import { file: String }
//! impl JobArgs for Import { const KIND: &'static str = "import"; }
//!
//! let (job, probe) = JobBuilder::new(Import { file: "a.csv".into() })
//!     .attempt(3)
//!     .checkpoint(&120u64) // an earlier attempt got this far
//!     .build();
//! assert_eq!((job.attempt(), job.kind(), job.queue()), (3, Some("import"), "default"));
//! assert_eq!(job.checkpoint::<u64>().unwrap(), Some(120));
//! probe.cancel(CancelReason::Shutdown);
//! assert_eq!(job.cancel_reason(), Some(CancelReason::Shutdown));
//! ```

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    CancelReason, Fence, InstanceId, JobArgs, TrackedLease, WorkId, DEFAULT_MAX_ATTEMPTS,
};

use crate::handler::{Job, JobContext, JobStore};

/// Builds a [`Job`] for a unit test. Defaults: id 1, claim token 1, the first attempt of
/// [`DEFAULT_MAX_ATTEMPTS`] (10) — or of the kind's `MAX_ATTEMPTS` —, created now, no
/// checkpoint, no metadata, a fresh random instance id; [`new`](Self::new) takes the queue and kind
/// from the payload's [`JobArgs`], [`untyped`](Self::untyped) the queue `"default"` and no
/// kind.
#[derive(Clone, Debug)]
pub struct JobBuilder<T> {
    payload: T,
    fence: Fence,
    instance: InstanceId,
    queue: String,
    kind: Option<String>,
    metadata: Option<Value>,
    attempt: i32,
    max_attempts: i32,
    created_at: DateTime<Utc>,
    checkpoint: Option<Value>,
}

impl<T: JobArgs> JobBuilder<T> {
    /// A job of `T`'s kind, in `T`'s queue, with `T`'s attempt limit (when it sets one).
    pub fn new(payload: T) -> Self {
        let mut builder = Self::untyped(payload).queue(T::QUEUE).kind(T::KIND);
        if let Some(max) = T::MAX_ATTEMPTS {
            builder.max_attempts = max;
        }
        builder
    }
}

impl<T> JobBuilder<T> {
    /// A job with any payload (a `serde_json::Value` for an untyped handler), in the queue
    /// `"default"`, without a kind.
    pub fn untyped(payload: T) -> Self {
        JobBuilder {
            payload,
            fence: Fence { id: 1, token: 1 },
            instance: InstanceId::new(),
            queue: "default".to_owned(),
            kind: None,
            metadata: None,
            attempt: 1,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            created_at: Utc::now(),
            checkpoint: None,
        }
    }

    /// The item's id ([`Job::id`]).
    pub fn id(mut self, id: WorkId) -> Self {
        self.fence.id = id;
        self
    }

    /// The item and claim token ([`Job::fence`]).
    pub fn fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The instance running it ([`Job::instance`]).
    pub fn instance(mut self, instance: InstanceId) -> Self {
        self.instance = instance;
        self
    }

    /// The queue ([`Job::queue`]).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The job kind ([`Job::kind`]).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// The metadata object ([`Job::metadata`]).
    pub fn metadata(mut self, metadata: Value) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// This attempt's number, 1 for the first ([`Job::attempt`]).
    pub fn attempt(mut self, attempt: i32) -> Self {
        self.attempt = attempt;
        self
    }

    /// How many attempts the item may have ([`Job::max_attempts`]).
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// When it was enqueued ([`Job::created_at`]).
    pub fn created_at(mut self, created_at: DateTime<Utc>) -> Self {
        self.created_at = created_at;
        self
    }

    /// The checkpoint an earlier attempt saved ([`Job::checkpoint`]). Panics when it does not
    /// serialize to JSON (a test's mistake, said at once).
    pub fn checkpoint<C: Serialize>(mut self, checkpoint: &C) -> Self {
        let value = serde_json::to_value(checkpoint).unwrap_or_else(|e| {
            panic!(
                "JobBuilder::checkpoint: the checkpoint ({}) does not serialize to JSON: {e}",
                std::any::type_name::<C>()
            )
        });
        self.checkpoint = Some(value);
        self
    }

    /// The job, and the probe that cancels it and reads its checkpoints.
    pub fn build(self) -> (Job<T>, JobProbe) {
        let lease = Arc::new(TestLease {
            fence: self.fence,
            token: CancellationToken::new(),
            reason: Mutex::new(None),
        });
        let checkpoints = Arc::new(Mutex::new(Vec::new()));
        let ctx = Arc::new(JobContext {
            fence: self.fence,
            instance: self.instance,
            queue: self.queue,
            kind: self.kind,
            metadata: self.metadata,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            created_at: self.created_at,
            checkpoint: self.checkpoint,
            lease: lease.clone(),
            store: JobStore::Detached {
                checkpoints: checkpoints.clone(),
            },
            completed_in_transaction: Default::default(),
        });
        (Job::new(self.payload, ctx), JobProbe { lease, checkpoints })
    }
}

/// Decodes a JSON job's payload into `U` as the claim worker does before it runs a handler of
/// `U`: the error is the message a dead letter records ("the payload does not match ...").
/// The job keeps its probe.
///
/// ```
/// use serde::Deserialize;
/// use workpump_claim_worker::testing::{decode, JobBuilder};
///
/// #[derive(Deserialize)]
/// struct Resize { width: u32 }
///
/// let (job, _probe) = JobBuilder::untyped(serde_json::json!({"width": 300})).build();
/// let job = decode::<Resize>(job).unwrap();
/// assert_eq!(job.payload().width, 300);
/// let (bad, _) = JobBuilder::untyped(serde_json::json!({"width": "wide"})).build();
/// let error = decode::<Resize>(bad).err().expect("\"wide\" is no width");
/// assert!(error.starts_with("the payload does not match"));
/// ```
pub fn decode<U: DeserializeOwned>(job: Job<Value>) -> Result<Job<U>, String> {
    let payload = crate::handler::decode_payload(job.payload().clone())?;
    Ok(job.with_payload(payload))
}

/// The test's side of a built job: fires its cancellation and reads what it saved. Cheap to
/// clone.
#[derive(Clone)]
pub struct JobProbe {
    lease: Arc<TestLease>,
    checkpoints: Arc<Mutex<Vec<Value>>>,
}

impl JobProbe {
    /// Fires the job's cancellation token with `reason` (what the lease-renewal worker or the
    /// host would: [`CancelReason::CancelRequested`] for an operator's cancel,
    /// [`CancelReason::Shutdown`] for a drain, [`CancelReason::LeaseLost`] ...). The first
    /// reason wins, as in production.
    pub fn cancel(&self, reason: CancelReason) {
        self.lease.cancel(reason);
    }

    /// The job's cancellation token.
    pub fn token(&self) -> CancellationToken {
        self.lease.token.clone()
    }

    /// Why the token fired, if it did.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.lease.cancel_reason()
    }

    /// Every checkpoint the handler saved, oldest first.
    pub fn checkpoints(&self) -> Vec<Value> {
        self.checkpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The last checkpoint saved, decoded as `C` (`Ok(None)`: none was saved).
    pub fn last_checkpoint<C: DeserializeOwned>(&self) -> Result<Option<C>, serde_json::Error> {
        self.checkpoints()
            .pop()
            .map(serde_json::from_value)
            .transpose()
    }
}

/// A lease that nothing renews and no fence bounds: it ends when the test cancels it.
struct TestLease {
    fence: Fence,
    token: CancellationToken,
    reason: Mutex<Option<CancelReason>>,
}

#[async_trait]
impl TrackedLease for TestLease {
    fn fence(&self) -> Fence {
        self.fence
    }

    fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    fn cancel_reason(&self) -> Option<CancelReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cancel(&self, reason: CancelReason) {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        self.token.cancel();
    }

    fn is_expired(&self) -> bool {
        false
    }

    async fn guard(&self) {
        self.token.cancelled().await;
    }

    fn dispose(&self) {}
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    use super::*;
    use crate::Disposition;

    #[derive(Serialize, Deserialize)]
    struct Report {
        month: String,
    }

    impl JobArgs for Report {
        const KIND: &'static str = "report";
        const QUEUE: &'static str = "reports";
        const MAX_ATTEMPTS: Option<i32> = Some(3);
    }

    #[test]
    fn a_typed_job_takes_its_queue_kind_and_attempts_from_its_args_and_the_rest_from_the_builder() {
        let created = DateTime::parse_from_rfc3339("2024-05-01T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let (job, _) = JobBuilder::new(Report {
            month: "2024-04".into(),
        })
        .id(42)
        .attempt(2)
        .created_at(created)
        .metadata(json!({"traceparent": "00-abc"}))
        .build();
        assert_eq!(job.payload().month, "2024-04");
        assert_eq!(
            (
                job.id(),
                job.queue(),
                job.kind(),
                job.attempt(),
                job.max_attempts()
            ),
            (42, "reports", Some("report"), 2, 3)
        );
        assert_eq!(job.created_at(), created);
        assert_eq!(job.metadata(), Some(&json!({"traceparent": "00-abc"})));
        assert_eq!(job.checkpoint::<u32>().unwrap(), None);

        let (job, _) = JobBuilder::untyped(json!({"n": 1})).queue("q").build();
        assert_eq!(
            (job.queue(), job.kind(), job.max_attempts()),
            ("q", None, 10)
        );
    }

    #[tokio::test]
    async fn the_probe_records_checkpoints_and_fires_the_token_with_the_first_reason() {
        let (job, probe) = JobBuilder::untyped(()).build();
        assert!(!job.is_cancelled());
        job.save_checkpoint(&json!({"row": 1})).await.unwrap();
        job.save_checkpoint(&json!({"row": 2})).await.unwrap();
        assert_eq!(
            probe.checkpoints(),
            vec![json!({"row": 1}), json!({"row": 2})]
        );
        assert_eq!(
            probe.last_checkpoint::<Value>().unwrap(),
            Some(json!({"row": 2}))
        );

        let token = job.cancellation_token();
        probe.cancel(CancelReason::CancelRequested);
        probe.cancel(CancelReason::Shutdown);
        token.cancelled().await;
        assert_eq!(job.cancel_reason(), Some(CancelReason::CancelRequested));
        assert_eq!(probe.cancel_reason(), Some(CancelReason::CancelRequested));
    }

    #[tokio::test]
    async fn a_built_job_has_no_store_for_a_transaction_and_says_so() {
        let (job, _) = JobBuilder::untyped(()).build();
        let Err(e) = job.begin_transaction().await else {
            panic!("a built job opened a transaction");
        };
        assert_eq!(e.disposition(), Disposition::DeadLetter);
        assert!(e.message().contains("no store"), "{e}");
    }
}
