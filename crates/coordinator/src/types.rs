//! The values that cross the [`WorkCoordinator`](crate::WorkCoordinator) seam: one params
//! struct in and one outcome struct out per method, so adding a field never breaks a
//! signature. No driver type appears here.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A work item's id.
pub type WorkId = i64;

/// The fence token minted by each claim (a sequence value). Every write of an attempt
/// (renew, complete, fail, release, checkpoint) must carry it.
pub type ClaimToken = i64;

/// One running host process. Fresh for every start of the process, so a restarted pod never
/// inherits a dead incarnation's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceId(pub Uuid);

impl InstanceId {
    /// A new random instance id.
    pub fn new() -> Self {
        InstanceId(Uuid::new_v4())
    }
}

impl Default for InstanceId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What every write on a leased item must match, besides the owning instance: the item and
/// the token minted by the claim that leased it. Public so that a handler can fence its own
/// external writes with it (store the token beside the effect and refuse older ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    /// The work item.
    pub id: WorkId,
    /// The claim's token.
    pub token: ClaimToken,
}

/// Where a work item is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkState {
    /// Due and waiting for a claim.
    Available,
    /// Waiting for its `run_at` (a delayed item, or a retry in backoff).
    Scheduled,
    /// Leased to an instance (or orphaned, waiting to be reclaimed).
    Running,
    /// Finished successfully.
    Completed,
    /// A dead letter: attempts used up, or rejected for good. Kept, inspectable, retryable.
    Dead,
    /// Cancelled by an operator.
    Cancelled,
    /// Waiting behind the head of its ordering key (an earlier unfinished item of its queue
    /// and key); promoted to available (or scheduled) when that head ends
    /// (docs/ordering.md).
    Blocked,
}

impl WorkState {
    /// The state's name in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Available => "available",
            WorkState::Scheduled => "scheduled",
            WorkState::Running => "running",
            WorkState::Completed => "completed",
            WorkState::Dead => "dead",
            WorkState::Cancelled => "cancelled",
            WorkState::Blocked => "blocked",
        }
    }

    /// Parses a state name from the store.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "available" => WorkState::Available,
            "scheduled" => WorkState::Scheduled,
            "running" => WorkState::Running,
            "completed" => WorkState::Completed,
            "dead" => WorkState::Dead,
            "cancelled" => WorkState::Cancelled,
            "blocked" => WorkState::Blocked,
            _ => return None,
        })
    }

    /// Whether the item has finished (completed, dead or cancelled).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            WorkState::Completed | WorkState::Dead | WorkState::Cancelled
        )
    }
}

impl fmt::Display for WorkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// register_queue

/// Declares a queue (see `register_queue` in docs/store.md: settings have one owner).
#[derive(Clone, Debug)]
pub struct RegisterQueueParams {
    /// 1 to 128 characters from `A-Z a-z 0-9 _ . : -`, starting with a letter or digit.
    pub name: String,
    /// Attempts an item of this queue gets unless it sets its own. **Default: 10.**
    pub max_attempts: i32,
    /// The declaring service (1 to 128 characters). The first service to declare a queue owns
    /// its settings: a later declaration by another service, or by an anonymous one (`None`),
    /// does not change them and gets the owner's settings back instead. **Default: none.**
    pub owner: Option<String>,
    /// What a dead letter of an ordering key does to the items of its key behind it
    /// (docs/ordering.md). **Default: [`OrderingDeadHead::Hold`].**
    pub ordering_dead_head: OrderingDeadHead,
    /// At most this many of the queue's items running across the whole fleet, 1 to
    /// [`MAX_RUNNING_LIMIT`] (docs/flow-control.md). **Default: none (unlimited).**
    pub max_running: Option<u32>,
    /// At most this many starts per period across the whole fleet (docs/flow-control.md).
    /// **Default: none (unlimited).**
    pub rate_limit: Option<RateLimit>,
}

impl RegisterQueueParams {
    /// A queue with the default settings, declared anonymously.
    pub fn new(name: impl Into<String>) -> Self {
        RegisterQueueParams {
            name: name.into(),
            max_attempts: crate::DEFAULT_MAX_ATTEMPTS,
            owner: None,
            ordering_dead_head: OrderingDeadHead::Hold,
            max_running: None,
            rate_limit: None,
        }
    }

    /// Sets the fleet-wide running limit (see
    /// [`max_running`](RegisterQueueParams#structfield.max_running)).
    pub fn max_running(mut self, max_running: Option<u32>) -> Self {
        self.max_running = max_running;
        self
    }

    /// Sets the fleet-wide rate limit (see
    /// [`rate_limit`](RegisterQueueParams#structfield.rate_limit)).
    pub fn rate_limit(mut self, rate_limit: Option<RateLimit>) -> Self {
        self.rate_limit = rate_limit;
        self
    }

    /// Sets what a dead head of an ordering key does (see
    /// [`ordering_dead_head`](RegisterQueueParams#structfield.ordering_dead_head)).
    pub fn ordering_dead_head(mut self, mode: OrderingDeadHead) -> Self {
        self.ordering_dead_head = mode;
        self
    }

    /// Declares it as `owner` (a service's name).
    pub fn owned_by(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

/// The result of `register_queue`: the queue's settings as stored after the call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterQueueOutcome {
    /// False when another service owns the settings (or the declaration was anonymous) and
    /// they differ from the declared ones: nothing was changed, and `owner` / `max_attempts`
    /// are the settings that stay.
    pub applied: bool,
    /// The service that owns the settings (`None`: nobody).
    pub owner: Option<String>,
    /// The queue's default attempt limit.
    pub max_attempts: i32,
    /// What a dead head of an ordering key does in this queue.
    pub ordering_dead_head: OrderingDeadHead,
    /// The fleet-wide running limit (`None`: unlimited).
    pub max_running: Option<u32>,
    /// The fleet-wide rate limit (`None`: unlimited).
    pub rate_limit: Option<RateLimit>,
}

/// The largest fleet-wide running limit a queue takes (`max_running`).
pub const MAX_RUNNING_LIMIT: u32 = 1_000_000;
/// The largest number of starts per period a rate limit takes.
pub const MAX_RATE_LIMIT: u32 = 1_000_000;
/// The shortest period of a rate limit.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// The longest period of a rate limit.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(86_400);

/// A queue's fleet-wide rate limit: at most `limit` items of the queue started per `period`
/// across every instance, a token bucket in the store (docs/flow-control.md). The bucket holds
/// up to `limit` tokens, so after an idle period up to `limit` items start at once; it refills
/// continuously at `limit / period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Starts per period, 1 to [`MAX_RATE_LIMIT`] (also the largest burst).
    pub limit: u32,
    /// The period, [`MIN_RATE_PERIOD`] to [`MAX_RATE_PERIOD`].
    pub period: Duration,
}

impl RateLimit {
    /// `limit` starts per `period` (checked where it is used: [`RateLimit::validate`]).
    pub fn new(limit: u32, period: Duration) -> Self {
        RateLimit { limit, period }
    }

    /// [`crate::Error::InvalidArgument`] naming the value out of range, if any.
    pub fn validate(&self) -> crate::Result<()> {
        if !(1..=MAX_RATE_LIMIT).contains(&self.limit) {
            return Err(crate::Error::InvalidArgument(format!(
                "rate_limit must be between 1 and {MAX_RATE_LIMIT}, got {}",
                self.limit
            )));
        }
        if !(MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(&self.period) {
            return Err(crate::Error::InvalidArgument(format!(
                "rate_period must be between 1 ms and 1 day, got {:?}",
                self.period
            )));
        }
        Ok(())
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.limit, self.period)
    }
}

impl Serialize for RateLimit {
    /// `{"limit": 100, "period_ms": 1000.0}`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RateLimit", 2)?;
        st.serialize_field("limit", &self.limit)?;
        st.serialize_field("period_ms", &(self.period.as_secs_f64() * 1000.0))?;
        st.end()
    }
}

/// [`crate::Error::InvalidArgument`] when a running limit is out of range (1 to
/// [`MAX_RUNNING_LIMIT`]).
pub fn validate_max_running(max_running: u32) -> crate::Result<()> {
    if !(1..=MAX_RUNNING_LIMIT).contains(&max_running) {
        return Err(crate::Error::InvalidArgument(format!(
            "max_running must be between 1 and {MAX_RUNNING_LIMIT}, got {max_running}"
        )));
    }
    Ok(())
}

/// What a dead letter that heads its ordering key does to the items of its key behind it, per
/// queue (docs/ordering.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderingDeadHead {
    /// The key waits: nothing behind the dead letter runs until an operator retries or
    /// discards it. Order is never broken. **The default.**
    #[default]
    Hold,
    /// The dead letter ends its key's head like a completion, and the next item runs.
    Skip,
}

impl OrderingDeadHead {
    /// Its name in the store (`hold` or `skip`).
    pub fn as_str(self) -> &'static str {
        match self {
            OrderingDeadHead::Hold => "hold",
            OrderingDeadHead::Skip => "skip",
        }
    }

    /// Parses a name from the store; anything else is [`crate::Error::InvalidArgument`]
    /// naming it.
    pub fn parse(s: &str) -> crate::Result<Self> {
        match s {
            "hold" => Ok(OrderingDeadHead::Hold),
            "skip" => Ok(OrderingDeadHead::Skip),
            other => Err(crate::Error::InvalidArgument(format!(
                "ordering_dead_head must be \"hold\" or \"skip\", got {other:?}"
            ))),
        }
    }
}

impl fmt::Display for OrderingDeadHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// enqueue_work

/// When a new item becomes due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// At once.
    #[default]
    Now,
    /// After a delay, measured on the database clock from the enqueue.
    After(Duration),
    /// At a business time (e.g. "tomorrow 09:00"). Lease arithmetic never uses it.
    At(DateTime<Utc>),
}

/// One item to enqueue.
#[derive(Clone, Debug)]
pub struct NewWork {
    /// A registered queue.
    pub queue: String,
    /// The payload the handler receives (at most [`crate::MAX_PAYLOAD_BYTES`] as JSON text,
    /// nested at most [`crate::MAX_PAYLOAD_DEPTH`] deep, no `\u0000` in strings).
    pub payload: Value,
    /// Lower runs first. **Default: 0.**
    pub priority: i16,
    /// When it becomes due. **Default: now.**
    pub schedule: Schedule,
    /// While an item with this key is unfinished in the same queue, enqueueing another with
    /// the same key writes nothing and returns the existing id. **Default: none.**
    pub unique_key: Option<String>,
    /// Attempts before it becomes a dead letter. **Default: the queue's.**
    pub max_attempts: Option<i32>,
    /// The job kind: which of the queue's handlers runs it (1 to [`crate::MAX_KIND_CHARS`]
    /// characters, no control characters). `None` is an untyped item, run by the queue's untyped handler. The
    /// typed API ([`JobArgs`](crate::JobArgs)) sets it to `JobArgs::KIND`. **Default: none.**
    pub kind: Option<String>,
    /// A JSON object carried beside the payload, which the handler's span reads: the W3C
    /// trace context (`traceparent`, `tracestate`) the host captures at enqueue lives here.
    /// Same limits as the payload. **Default: none.**
    pub metadata: Option<Value>,
    /// The ordering key (1 to [`crate::MAX_ORDERING_KEY_CHARS`] characters, no control
    /// characters): the items of one queue and key run one at a time, in enqueue order (for
    /// one key, the order in which the enqueueing transactions committed); items of different
    /// keys run in parallel. A later item waits in state [`WorkState::Blocked`] until the one
    /// before it has completed, been cancelled or discarded, or — in a queue whose
    /// [`OrderingDeadHead`] is `skip` — become a dead letter (docs/ordering.md).
    /// **Default: none** (unordered).
    pub ordering_key: Option<String>,
}

impl NewWork {
    /// An item for `queue` with `payload`, due now, priority 0.
    pub fn new(queue: impl Into<String>, payload: Value) -> Self {
        NewWork {
            queue: queue.into(),
            payload,
            priority: 0,
            schedule: Schedule::Now,
            unique_key: None,
            max_attempts: None,
            kind: None,
            metadata: None,
            ordering_key: None,
        }
    }

    /// Sets the ordering key (see [`NewWork::ordering_key`](NewWork#structfield.ordering_key)).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets the job kind (see [`NewWork::kind`](NewWork#structfield.kind)).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Sets the metadata object (see [`NewWork::metadata`](NewWork#structfield.metadata)).
    pub fn metadata(mut self, metadata: Value) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Sets the priority (lower runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Makes the item due after `delay`.
    pub fn run_after(mut self, delay: Duration) -> Self {
        self.schedule = Schedule::After(delay);
        self
    }

    /// Makes the item due at `at`.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.schedule = Schedule::At(at);
        self
    }

    /// Sets a unique key.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// Sets the item's own attempt limit.
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }
}

/// Enqueues a batch (one round trip, all or nothing).
#[derive(Clone, Debug, Default)]
pub struct EnqueueWorkParams {
    /// 1 to [`crate::MAX_ENQUEUE_BATCH`] items.
    pub items: Vec<NewWork>,
}

/// What happened to one enqueued item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The item's id (the existing item's, when a unique key matched one).
    pub id: WorkId,
    /// False when a unique key matched an unfinished item and nothing was written.
    pub inserted: bool,
}

/// The result of `enqueue_work`: one entry per input item, in input order.
#[derive(Clone, Debug, Default)]
pub struct EnqueueWorkOutcome {
    /// In input order.
    pub items: Vec<Enqueued>,
}

// ---------------------------------------------------------------------------------------------
// claim_work

/// Leases up to `max_items` items of `queues` to `instance`.
#[derive(Clone, Debug)]
pub struct ClaimWorkParams {
    /// The claiming instance; it must have recorded a heartbeat.
    pub instance: InstanceId,
    /// The queues to claim from (claimed in one index range each).
    pub queues: Vec<String>,
    /// 1 to 10 000; the claim worker passes its free handler slots.
    pub max_items: u32,
    /// How long the lease lasts without renewal.
    pub lease: Duration,
    /// Commit the claim without waiting for its WAL flush (the queue's `async_commit`, off by
    /// default): the reply comes sooner, but a server crash or failover can lose the claim,
    /// and a peer may then claim the item while this handler still runs (the fence keeps one
    /// outcome; docs/guarantees.md). The fake coordinator, which has no commit, ignores it.
    pub async_commit: bool,
}

/// One leased item.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedWork {
    /// The item and the token of this claim.
    pub fence: Fence,
    /// Its queue.
    pub queue: String,
    /// Its job kind (`None`: untyped).
    pub kind: Option<String>,
    /// Its payload.
    pub payload: Value,
    /// The metadata object its enqueuer attached (the trace context), if any.
    pub metadata: Option<Value>,
    /// Its priority.
    pub priority: i16,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
    /// Attempts it may have in all.
    pub max_attempts: i32,
    /// The checkpoint an earlier attempt saved, if any.
    pub checkpoint: Option<Value>,
    /// The lease's expiry on the database clock (informational: workers reason with their
    /// monotonic clock from when the claim was sent).
    pub lease_expiry: DateTime<Utc>,
    /// When the item was enqueued.
    pub created_at: DateTime<Utc>,
    /// True when this claim took over an orphan (a dead or released owner's lease).
    pub reclaimed: bool,
    /// How long the item waited from being due (`run_at`: its enqueue, its retry time or its
    /// schedule) to this claim, on the database clock; `None` for a reclaimed orphan, whose
    /// wait measures its dead owner rather than the queue. The claim worker records it as the
    /// pickup-lag histogram.
    pub pickup_lag: Option<Duration>,
}

/// The result of `claim_work`.
#[derive(Clone, Debug, Default)]
pub struct ClaimWorkOutcome {
    /// The claimed items.
    pub items: Vec<ClaimedWork>,
    /// The drain hint: claimable items were left after filling `max_items`; poll again at once.
    /// A throttled queue never makes it true.
    pub has_more: bool,
    /// The queues whose flow limit bounded this claim (docs/flow-control.md), one entry per
    /// queue (a claim may name several), in no particular order; empty when none did.
    pub throttles: Vec<Throttle>,
    /// Orphans of the claimed queues with no attempts left (dead letters) or a cancel
    /// requested (cancelled) that this claim ended instead of reclaiming them: the transition
    /// `dead_letter_expired` makes, made by the claim that found them first.
    pub orphans_ended: DeadLetterExpiredOutcome,
}

/// A queue's flow limit bounded a claim: it had at least as many claimable items as its limit
/// let this claim take (possibly none).
#[derive(Clone, Debug, PartialEq)]
pub struct Throttle {
    /// The queue.
    pub queue: String,
    /// Which limit.
    pub reason: ThrottleReason,
    /// For [`ThrottleReason::Rate`], how long until the queue's next token, on the store's
    /// clock; `None` for [`ThrottleReason::Running`] (a slot frees when an item ends or a dead
    /// instance's lease is reclaimed: no time is known).
    pub retry_after: Option<Duration>,
}

/// Which flow limit throttled a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ThrottleReason {
    /// `max_running` items of the queue are running across the fleet (reported when both
    /// limits bind).
    Running,
    /// The queue's rate bucket is empty.
    Rate,
}

impl ThrottleReason {
    /// Its name in the store and as a metric label (`running`, `rate`).
    pub fn as_str(self) -> &'static str {
        match self {
            ThrottleReason::Running => "running",
            ThrottleReason::Rate => "rate",
        }
    }

    /// Parses a name from the store; anything else is [`crate::Error::InvalidArgument`].
    pub fn parse(s: &str) -> crate::Result<Self> {
        match s {
            "running" => Ok(ThrottleReason::Running),
            "rate" => Ok(ThrottleReason::Rate),
            other => Err(crate::Error::InvalidArgument(format!(
                "unknown throttle reason {other:?}"
            ))),
        }
    }
}

impl fmt::Display for ThrottleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// renew_leases

/// Extends a batch of leases held by `instance`.
#[derive(Clone, Debug)]
pub struct RenewLeasesParams {
    /// The owner.
    pub instance: InstanceId,
    /// The leases to extend.
    pub leases: Vec<Fence>,
    /// The new lease length from the database's now.
    pub lease: Duration,
}

/// What became of one lease in a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalStatus {
    /// Extended by the full lease.
    Renewed,
    /// No longer this claim's (reclaimed, released, finished or expired): stop the handler.
    Lost,
    /// Held, but its row was locked by another transaction (usually the handler's own fenced
    /// transaction): not extended this time, not lost.
    Busy,
    /// The instance itself is gone: it was reaped (deleted and tombstoned) by a sweep, so every
    /// lease it held is lost, whatever the row says. Stop the handler; the instance registers
    /// afresh under a new id.
    Evicted,
}

/// The reply for one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The lease asked about.
    pub fence: Fence,
    /// What happened to it.
    pub status: RenewalStatus,
    /// An operator asked to cancel the item.
    pub cancel_requested: bool,
}

/// The result of `renew_leases`: one entry per distinct requested lease (a lease asked for
/// twice is renewed and answered once), in the order of its first request.
#[derive(Clone, Debug, Default)]
pub struct RenewLeasesOutcome {
    /// In the order of each lease's first request.
    pub items: Vec<Renewal>,
}

// ---------------------------------------------------------------------------------------------
// complete_work / fail_work / release_work / checkpoint_work

/// Records success for a batch of items.
#[derive(Clone, Debug)]
pub struct CompleteWorkParams {
    /// The owner.
    pub instance: InstanceId,
    /// The claims that succeeded.
    pub items: Vec<Fence>,
    /// Hand-off (docs/ordering.md): the queues in which a completed head of an ordering key
    /// hands its key's next item straight to `instance`, claimed in the same transaction, each
    /// with the lease such a claim gets. Only an item that would become available now is
    /// handed on, and only in a queue without flow limits (docs/flow-control.md); the others
    /// are promoted for any claimer, as without. Empty: no hand-off.
    pub hand_off: Vec<HandOff>,
}

/// A queue in which completions hand ordering keys on to the completing instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandOff {
    /// The queue.
    pub queue: String,
    /// The lease of an item handed on (as `ClaimWorkParams::lease`).
    pub lease: Duration,
}

/// An item claimed by a completion (`complete_work`'s hand-off) for the completing instance.
#[derive(Clone, Debug, PartialEq)]
pub struct HandedOff {
    /// The completed claim whose key it follows.
    pub after: Fence,
    /// The item, leased as by `claim_work` (`reclaimed` false, `pickup_lag` `None`: it waited
    /// behind its key, not in the queue).
    pub item: ClaimedWork,
}

/// What a fenced outcome write did to one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutcomeRecord {
    /// The claim the write was for.
    pub fence: Fence,
    /// The state the item went to, or `None` when the write was fenced out (nothing changed).
    pub state: Option<WorkState>,
}

impl OutcomeRecord {
    /// Whether the write was refused because the claim no longer holds the item.
    pub fn fenced_out(&self) -> bool {
        self.state.is_none()
    }
}

/// The result of a batch outcome write (`complete_work`, `fail_work`, `release_work`): one
/// entry per distinct requested claim, in the order of its first request. A claim named twice
/// is written once, with its first outcome (a second, different outcome is not applied, and
/// not reported as if it were).
#[derive(Clone, Debug, Default)]
pub struct OutcomeBatch {
    /// In the order of each claim's first request.
    pub items: Vec<OutcomeRecord>,
    /// `complete_work` with [`CompleteWorkParams::hand_off`]: the items its completions
    /// handed on to the caller, at most one per completed claim. Always empty for the others.
    pub handed_off: Vec<HandedOff>,
}

impl OutcomeBatch {
    /// The items whose write was fenced out.
    pub fn fenced_out(&self) -> impl Iterator<Item = Fence> + '_ {
        self.items
            .iter()
            .filter(|r| r.fenced_out())
            .map(|r| r.fence)
    }

    /// `Ok` when every write was recorded, else [`crate::Error::FencedOut`] for the first
    /// refused item.
    pub fn all_recorded(&self) -> crate::Result<()> {
        match self.fenced_out().next() {
            Some(f) => Err(crate::Error::FencedOut { id: f.id }),
            None => Ok(()),
        }
    }
}

/// The result of `complete_work`.
pub type CompleteWorkOutcome = OutcomeBatch;
/// The result of `fail_work`.
pub type FailWorkOutcome = OutcomeBatch;
/// The result of `release_work`.
pub type ReleaseWorkOutcome = OutcomeBatch;

/// Where a failed item goes next. An item whose cancel an operator requested ends cancelled
/// whatever the disposition (an operator's cancel is never lost to a retry, nor turned into
/// a dead letter), with a history entry saying so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailDisposition {
    /// Retry after this delay (zero: at once) if attempts are left, else a dead letter.
    RetryAfter(Duration),
    /// Rejected for good: straight to the dead letters.
    DeadLetter,
    /// The handler stopped on an operator's cancel: the item ends cancelled.
    Cancelled,
}

/// One failed attempt.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The claim that failed.
    pub fence: Fence,
    /// What went wrong; kept in the item's error history (truncated to 8 KiB).
    pub error: String,
    /// Where the item goes next.
    pub disposition: FailDisposition,
}

/// Records failed attempts for a batch of items.
#[derive(Clone, Debug)]
pub struct FailWorkParams {
    /// The owner.
    pub instance: InstanceId,
    /// The failures.
    pub items: Vec<Failure>,
}

/// Gives leases back before they expire (a drain).
#[derive(Clone, Debug)]
pub struct ReleaseWorkParams {
    /// The owner.
    pub instance: InstanceId,
    /// The claims to give back.
    pub items: Vec<Fence>,
    /// False for a drain: the attempt is not counted. True: it counts (and an item with no
    /// attempts left becomes a dead letter).
    pub consume_attempt: bool,
}

/// Saves a checkpoint on a running item.
#[derive(Clone, Debug)]
pub struct CheckpointWorkParams {
    /// The owner.
    pub instance: InstanceId,
    /// The claim.
    pub fence: Fence,
    /// The checkpoint; JSON null clears it.
    pub checkpoint: Value,
}

/// The result of `checkpoint_work` (a fenced-out write is [`crate::Error::FencedOut`]).
#[derive(Clone, Debug, Default)]
pub struct CheckpointWorkOutcome {}

// ---------------------------------------------------------------------------------------------
// record_heartbeat / cleanup_stale_instances / deregister_instance

/// An instance says it is alive.
#[derive(Clone, Debug)]
pub struct RecordHeartbeatParams {
    /// The instance.
    pub instance: InstanceId,
    /// Its host name (metadata).
    pub host: String,
    /// Free-form metadata (pid, version...).
    pub metadata: Value,
    /// A peer whose heartbeat is older than this is stale. **Default: 30 s.**
    pub stale_after: Duration,
    /// A peer whose heartbeat is older than this is dead even if its alive-lock is held.
    /// **Default: 5 min.** `None` disables the bypass.
    pub dead_after: Option<Duration>,
    /// A lock-proven peer whose alive-lock has been gone this long is dead (failover in
    /// seconds). **Default: 3 s.** `None` disables the rule: death then waits for staleness.
    pub lock_grace: Option<Duration>,
    /// What this beat says about the instance's alive-lock (only its own session counts).
    pub alive_lock: AliveLockReport,
    /// This is the instance's first beat: a missing row is inserted. After the first recorded
    /// beat, a missing row can only mean the instance was reaped, so the store answers
    /// `evicted` (also after the eviction's tombstone was pruned).
    pub registering: bool,
}

/// What a heartbeat reports about the instance's alive-lock. The stored cutoffs, the stale
/// rule and the store's sweep are described in the SQL function `cleanup_stale_instances`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AliveLockReport {
    /// Nothing: the store keeps what it knew (a beat from a part of the process that does not
    /// hold the lock, such as the claim loop registering the instance).
    #[default]
    Unreported,
    /// The instance holds no lock session now, so it does not rely on the lock: peers judge
    /// it by its beats until its lock is taken again.
    NotHeld,
    /// The instance holds its lock with this session
    /// ([`AliveLockSession::session_id`](crate::AliveLockSession::session_id)): credited only
    /// when that very session holds the lock, never another holder (a half-open former
    /// session is not a proof of life).
    Session(i32),
}

/// The result of `record_heartbeat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeartbeatOutcome {
    /// This instance was already reaped: nothing was written; treat every lease as lost,
    /// cancel every handler and register afresh under a new id.
    pub evicted: bool,
    /// Stale peers the opportunistic sweep deleted.
    pub reaped: u64,
    /// Leases those peers held, now released.
    pub released: u64,
}

/// Deletes stale instances and releases their leases.
#[derive(Clone, Copy, Debug)]
pub struct CleanupStaleInstancesParams {
    /// The sweeping instance: it is never reaped, and it judges only on what it could see
    /// while its own sessions stayed connected (`judge_watch` in
    /// the SQL function `cleanup_stale_instances`). `None`: an operator's sweep, watched by the
    /// calling session alone.
    pub judge: Option<InstanceId>,
    /// See [`RecordHeartbeatParams::stale_after`].
    pub stale_after: Duration,
    /// See [`RecordHeartbeatParams::dead_after`].
    pub dead_after: Option<Duration>,
    /// See [`RecordHeartbeatParams::lock_grace`].
    pub lock_grace: Option<Duration>,
}

/// One reaped instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReapedInstance {
    /// The instance deleted.
    pub instance: InstanceId,
    /// How many leases it held, now released.
    pub released: u64,
}

/// The result of `cleanup_stale_instances`.
#[derive(Clone, Debug, Default)]
pub struct CleanupStaleInstancesOutcome {
    /// The instances deleted.
    pub reaped: Vec<ReapedInstance>,
}

/// An instance leaves (the end of a drain).
#[derive(Clone, Copy, Debug)]
pub struct DeregisterInstanceParams {
    /// The instance.
    pub instance: InstanceId,
}

/// The result of `deregister_instance`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeregisterInstanceOutcome {
    /// Leases it still held, now released (they count an attempt).
    pub released: u64,
}

// ---------------------------------------------------------------------------------------------
// maintenance: promote_scheduled / dead_letter_expired / prune_finished /
// prune_evicted_instances / queue_depth

/// The most rows one maintenance statement (`promote_scheduled`, `dead_letter_expired`,
/// `prune_finished`, `prune_evicted_instances`) touches.
pub const MAX_SWEEP_BATCH: u32 = 10_000;

/// The longest retention accepted (the same 100 years as scheduling ahead).
pub const MAX_RETENTION: Duration = crate::MAX_SCHEDULE_AHEAD;

/// A number of items in one queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueCount {
    /// The queue.
    pub queue: String,
    /// How many items.
    pub items: u64,
}

/// Promotes due scheduled items (delays that came due, retries whose backoff ran out) to
/// available, in every queue, and wakes their claimers.
#[derive(Clone, Copy, Debug)]
pub struct PromoteScheduledParams {
    /// At most this many items, 1 to [`MAX_SWEEP_BATCH`].
    pub limit: u32,
}

/// The result of `promote_scheduled`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromoteScheduledOutcome {
    /// Items promoted per queue (only queues with some), by queue name.
    pub queues: Vec<QueueCount>,
}

impl PromoteScheduledOutcome {
    /// Items promoted in all. Equal to the limit: more may be due.
    pub fn promoted(&self) -> u64 {
        self.queues.iter().map(|q| q.items).sum()
    }
}

/// The sweep's step for leases that are gone: releases leases that lapsed under a
/// still-registered owner (so that the next claim reclaims the item), then ends orphans that
/// must not run again, in every queue: no attempts left → dead, cancel requested → cancelled.
#[derive(Clone, Copy, Debug)]
pub struct DeadLetterExpiredParams {
    /// At most this many leases released, and at most this many items ended, 1 to
    /// [`MAX_SWEEP_BATCH`].
    pub limit: u32,
}

/// The result of `dead_letter_expired`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterExpiredOutcome {
    /// Leases that lapsed under a still-registered owner, released (their items are orphans
    /// now, reclaimed by the next claim), per queue, by queue name.
    pub released: Vec<QueueCount>,
    /// Orphans that became dead letters, per queue (only queues with some), by queue name.
    pub dead: Vec<QueueCount>,
    /// Cancel-requested orphans that ended cancelled, per queue, by queue name.
    pub cancelled: Vec<QueueCount>,
}

impl DeadLetterExpiredOutcome {
    /// Dead letters made.
    pub fn dead_lettered(&self) -> u64 {
        self.dead.iter().map(|q| q.items).sum()
    }

    /// Items ended cancelled.
    pub fn cancelled(&self) -> u64 {
        self.cancelled.iter().map(|q| q.items).sum()
    }

    /// Items ended in all. Equal to the limit: more may be left.
    pub fn ended(&self) -> u64 {
        self.dead_lettered() + self.cancelled()
    }

    /// Lapsed leases released. Equal to the limit: more may be left.
    pub fn released(&self) -> u64 {
        self.released.iter().map(|q| q.items).sum()
    }

    /// The log's words for one queue's dead letters of [`Self::dead`]: the maintenance sweep
    /// and the claim worker (whose claims end orphans too) say the same.
    pub fn dead_letter_message(count: &QueueCount) -> String {
        format!(
            "{} items of queue {:?} became dead letters: the lease of their last attempt \
             expired (the handler hung past its lease, or its instance died) with no attempts \
             left",
            count.items, count.queue
        )
    }
}

/// Asks which maintenance steps have work, in one statement.
#[derive(Clone, Copy, Debug)]
pub struct MaintenanceDueParams {
    /// As in [`CleanupStaleInstancesParams`].
    pub judge: Option<InstanceId>,
    /// As in [`CleanupStaleInstancesParams`].
    pub stale_after: Duration,
    /// As in [`CleanupStaleInstancesParams`].
    pub dead_after: Option<Duration>,
    /// As in [`CleanupStaleInstancesParams`].
    pub lock_grace: Option<Duration>,
    /// As in [`PruneFinishedParams`].
    pub completed_retention: Duration,
    /// As in [`PruneFinishedParams`].
    pub dead_retention: Duration,
    /// As in [`PruneEvictedInstancesParams`].
    pub evicted_retention: Duration,
    /// Look for leases that lapsed under a registered owner only when no look within this
    /// long, this instance's or a peer's, found none. The look visits every running row of the
    /// store, so the fleet takes it in turns; a call off its turn reports only the other
    /// orphans, and a look that finds a lapsed lease leaves the turn to the next call, so that
    /// every sweep looks until they are released (docs/store.md, "Leases that lapse"). The
    /// maintenance sweep sends half its interval; `Duration::ZERO` looks at every call that
    /// is not beside another's look. At most 24 h.
    pub lapsed_look_every: Duration,
}

/// The longest period of a fleet's turn ([`MaintenanceDueParams::lapsed_look_every`],
/// [`OrderingRepairParams::every`], [`QueueDepthParams::max_age`]): a day.
pub const MAX_TURN_PERIOD: Duration = Duration::from_secs(24 * 3600);

/// Refuses a fleet's turn period longer than [`MAX_TURN_PERIOD`], naming the call and field.
fn validate_turn_period(call: &str, field: &str, period: Duration) -> crate::Result<()> {
    if period > MAX_TURN_PERIOD {
        return Err(crate::Error::InvalidArgument(format!(
            "{call}: {field} must be at most 24 h, got {period:?}"
        )));
    }
    Ok(())
}

/// Which maintenance steps have work (hints: a step that finds nothing is harmless).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaintenanceDueOutcome {
    /// `cleanup_stale_instances`: some instance may be dead (or a lost lock was taken again).
    pub instances: bool,
    /// `dead_letter_expired`: an orphan must not run again.
    pub orphans: bool,
    /// `promote_scheduled`: a scheduled item is due.
    pub scheduled: bool,
    /// `prune_finished`: a finished item is past its retention.
    pub finished: bool,
    /// `prune_evicted_instances`: a tombstone is past its retention.
    pub tombstones: bool,
    /// `vacuum_work`: the work table is due a vacuum this role may run (the SQL function
    /// `work_vacuum_due`).
    pub vacuum: bool,
}

/// Deletes finished items past their retention.
#[derive(Clone, Copy, Debug)]
pub struct PruneFinishedParams {
    /// Completed items older than this (since they finished) go. **Default: 24 h.**
    pub completed_retention: Duration,
    /// Dead letters and cancelled items older than this go. **Default: 7 days.**
    pub dead_retention: Duration,
    /// At most this many items, 1 to [`MAX_SWEEP_BATCH`]; completed items first.
    pub limit: u32,
}

/// Repairs ordering keys left without a head (`ordering_repair`; must never find any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderingRepairParams {
    /// At most this many keys, 1 to [`MAX_SWEEP_BATCH`].
    pub limit: u32,
    /// Check only when no check within this long, this instance's or a peer's, found every
    /// headless key. The check reads every blocked item of the store, so the fleet takes it in
    /// turns; a call off its turn, or beside a peer's check, repairs nothing and reads one row
    /// (docs/ordering.md, "The backstop"). The maintenance sweep sends half its interval;
    /// `Duration::ZERO` checks at every call that is not beside another's check. At most 24 h.
    pub every: Duration,
}

impl OrderingRepairParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        if !(1..=MAX_SWEEP_BATCH).contains(&self.limit) {
            return Err(crate::Error::InvalidArgument(format!(
                "ordering_repair: limit must be between 1 and {MAX_SWEEP_BATCH}, got {}",
                self.limit
            )));
        }
        validate_turn_period("ordering_repair", "every", self.every)
    }
}

/// The result of `ordering_repair`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderingRepairOutcome {
    /// Keys that had blocked items but no head, each given its next item as head. Anything
    /// but 0 is a bug (or a write outside the store's functions): the maintenance worker
    /// counts it in `workpump_ordering_repairs_total`.
    pub repaired: u64,
}

/// The result of `prune_finished`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneFinishedOutcome {
    /// Completed items deleted.
    pub completed: u64,
    /// Dead letters deleted.
    pub dead: u64,
    /// Cancelled items deleted.
    pub cancelled: u64,
    /// Partitions of the completed items' history attached ahead of now (the SQL function
    /// `rotate_history`; docs/store.md, "Retention of completed items"). A store without
    /// partitions reports 0.
    pub partitions_created: u64,
    /// Partitions of the completed items' history dropped whole, their window past the
    /// retention: their items are gone without being counted in `completed`.
    pub partitions_dropped: u64,
    /// A partition could not be dropped or attached because a lock was not had in time (a
    /// transaction held the history, or another instance was rotating it): the next call
    /// goes on.
    pub partitions_busy: bool,
}

impl PruneFinishedOutcome {
    /// Items deleted in all. Equal to the limit: more may be left.
    pub fn pruned(&self) -> u64 {
        self.completed + self.dead + self.cancelled
    }
}

/// Deletes eviction tombstones (see `record_heartbeat`) past their retention.
#[derive(Clone, Copy, Debug)]
pub struct PruneEvictedInstancesParams {
    /// Tombstones older than this go. **Default: 7 days.**
    pub retention: Duration,
    /// At most this many, 1 to [`MAX_SWEEP_BATCH`].
    pub limit: u32,
}

/// The result of `prune_evicted_instances`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneEvictedInstancesOutcome {
    /// Tombstones deleted. Equal to the limit: more may be left.
    pub pruned: u64,
}

/// Counts the items that wait or run, per queue and state, or reads the fleet's last count.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueDepthParams {
    /// Return the fleet's last sample, anyone's, while it is younger than this; count anew
    /// (and store the count as the fleet's sample) only when it is older. A count visits every
    /// waiting and running item, so the fleet takes it in turns: a call that finds a peer
    /// counting returns the last sample instead, older than asked (docs/store.md, "The queue
    /// depth, sampled in turns"). The maintenance sweep sends half its sampling interval;
    /// `Duration::ZERO` (the default) counts unless a peer is counting. At most 24 h.
    pub max_age: Duration,
}

impl QueueDepthParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        validate_turn_period("queue_depth", "max_age", self.max_age)
    }
}

/// How many items of one queue are in one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueDepth {
    /// The queue.
    pub queue: String,
    /// Available, scheduled or running.
    pub state: WorkState,
    /// How many.
    pub items: u64,
    /// For available and scheduled: how long the oldest item of this state that is due
    /// (`run_at` passed) has been due, on the database clock; zero when none is, and always
    /// zero for running.
    pub oldest_due_age: Duration,
}

/// The result of `queue_depth`: every registered queue with each of the states available,
/// scheduled and running (zero included), plus any other queue holding such items; by queue,
/// then state in the order available, scheduled, running.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueDepthOutcome {
    /// By queue, then state.
    pub depths: Vec<QueueDepth>,
    /// How old the sample is: every count and age in it is as of then (zero for a count this
    /// call made).
    pub sample_age: Duration,
}

impl QueueDepthOutcome {
    /// The count for one queue and state (0 when absent).
    pub fn get(&self, queue: &str, state: WorkState) -> u64 {
        self.depths
            .iter()
            .find(|d| d.queue == queue && d.state == state)
            .map_or(0, |d| d.items)
    }

    /// A queue's pickup lag as sampled: how long its oldest waiting due item (available, or
    /// scheduled and not yet promoted) has waited to be claimed; zero when none waits.
    pub fn pickup_lag(&self, queue: &str) -> Duration {
        self.depths
            .iter()
            .filter(|d| d.queue == queue && d.state != WorkState::Running)
            .map(|d| d.oldest_due_age)
            .max()
            .unwrap_or_default()
    }
}

/// Reads the state of the server that workpump depends on.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerStatusParams {}

/// The result of `server_status`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerStatusOutcome {
    /// The share of the server's NOTIFY queue in use, 0 to 1
    /// (`pg_notification_queue_usage()`). One LISTEN session anywhere on the server that stops
    /// reading pins the queue; when it is full every enqueue fails at commit.
    pub notification_queue_usage: f64,
}

/// Vacuums the work table when it is due (see [`VacuumWorkOutcome`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct VacuumWorkParams {}

/// The result of `vacuum_work`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VacuumWorkOutcome {
    /// A `VACUUM` of the work table ran (or found the table locked by another vacuum, which
    /// does the same, and skipped it). `false`: the SQL function `work_vacuum_due` said no —
    /// the table's dead rows are below autovacuum's threshold for it, a vacuum of it is
    /// running, or this role may not vacuum it.
    pub vacuumed: bool,
}

// ---------------------------------------------------------------------------------------------
// operator: cancel_work / retry_dead_work / discard_work

/// An operator cancels a work item.
#[derive(Clone, Copy, Debug)]
pub struct CancelWorkParams {
    /// The item.
    pub id: WorkId,
}

/// What a cancel did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancellation {
    /// The item was available or scheduled; it is cancelled now.
    Cancelled,
    /// The item is running: the cancel is requested. Its owner learns it in the next renewal
    /// reply and the item ends cancelled when the handler stops, whatever it then records but
    /// a success (a failure to retry, a rejection and a drain's release end it cancelled too),
    /// or at its reclaim, or in the next maintenance sweep, when its owner is gone.
    Requested,
}

/// The result of `cancel_work`. A finished item is refused with
/// [`crate::Error::InvalidState`]; an unknown id with [`crate::Error::NotFound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CancelWorkOutcome {
    /// What happened.
    pub cancellation: Cancellation,
}

/// An operator retries a dead letter: back to available, due now, attempts reset to 0, error
/// history kept (with a `retried` entry), checkpoint kept.
#[derive(Clone, Copy, Debug)]
pub struct RetryDeadWorkParams {
    /// The dead letter.
    pub id: WorkId,
}

/// The result of `retry_dead_work`. Any state but dead is refused with
/// [`crate::Error::InvalidState`] (as is a retry whose unique key another unfinished item of
/// the queue holds); an unknown id with [`crate::Error::NotFound`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryDeadWorkOutcome {
    /// The item's queue (its claimers were woken).
    pub queue: String,
}

/// An operator deletes a finished item (completed, dead or cancelled) for good.
#[derive(Clone, Copy, Debug)]
pub struct DiscardWorkParams {
    /// The item.
    pub id: WorkId,
}

/// The result of `discard_work`. An unfinished item is refused with
/// [`crate::Error::InvalidState`] (cancel it first); an unknown id with
/// [`crate::Error::NotFound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardWorkOutcome {
    /// The state the item had when it was deleted.
    pub state: WorkState,
}

pub(crate) fn validate_sweep_limit(what: &str, limit: u32) -> crate::Result<()> {
    if limit == 0 || limit > MAX_SWEEP_BATCH {
        return Err(crate::Error::InvalidArgument(format!(
            "{what}: limit must be between 1 and {MAX_SWEEP_BATCH}, got {limit}"
        )));
    }
    Ok(())
}

pub(crate) fn validate_retention(what: &str, name: &str, retention: Duration) -> crate::Result<()> {
    if retention.as_micros() == 0 || retention > MAX_RETENTION {
        return Err(crate::Error::InvalidArgument(format!(
            "{what}: {name} must be between 1 µs and 100 years, got {retention:?}"
        )));
    }
    Ok(())
}

impl PromoteScheduledParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        validate_sweep_limit("promote_scheduled", self.limit)
    }
}

impl DeadLetterExpiredParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        validate_sweep_limit("dead_letter_expired", self.limit)
    }
}

impl PruneFinishedParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        validate_retention(
            "prune_finished",
            "completed_retention",
            self.completed_retention,
        )?;
        validate_retention("prune_finished", "dead_retention", self.dead_retention)?;
        validate_sweep_limit("prune_finished", self.limit)
    }
}

impl PruneEvictedInstancesParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        validate_retention("prune_evicted_instances", "retention", self.retention)?;
        validate_sweep_limit("prune_evicted_instances", self.limit)
    }
}

impl MaintenanceDueParams {
    pub(crate) fn validate(&self) -> crate::Result<()> {
        crate::validate::validate_stale(self.stale_after, self.dead_after, self.lock_grace)?;
        validate_retention(
            "maintenance_due",
            "completed_retention",
            self.completed_retention,
        )?;
        validate_retention("maintenance_due", "dead_retention", self.dead_retention)?;
        validate_retention(
            "maintenance_due",
            "evicted_retention",
            self.evicted_retention,
        )?;
        validate_turn_period(
            "maintenance_due",
            "lapsed_look_every",
            self.lapsed_look_every,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// alive-lock

/// Takes an instance's alive-lock on a dedicated session.
#[derive(Clone, Copy, Debug)]
pub struct TakeAliveLockParams {
    /// The instance.
    pub instance: InstanceId,
}

/// The result of `take_alive_lock`: the session that holds (or keeps trying to hold) the lock.
pub struct TakeAliveLockOutcome {
    /// Whether the session holds the lock now.
    pub held: bool,
    /// The dedicated session; dropping it releases the lock.
    pub session: Box<dyn crate::AliveLockSession>,
}

impl fmt::Debug for TakeAliveLockOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TakeAliveLockOutcome")
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// Asks whether some session holds an instance's alive-lock.
#[derive(Clone, Copy, Debug)]
pub struct IsInstanceAliveParams {
    /// The instance.
    pub instance: InstanceId,
}

/// The result of `is_instance_alive`.
#[derive(Clone, Copy, Debug, Default)]
pub struct IsInstanceAliveOutcome {
    /// Some session holds the instance's alive-lock.
    pub alive: bool,
}

// ---------------------------------------------------------------------------------------------
// listen

/// Opens a listener for wake signals (work became due somewhere).
#[derive(Clone, Debug, Default)]
pub struct ListenParams {}

/// What a listener reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenEvent {
    /// The listener is (re)connected and listening; anything sent while it was down was
    /// missed, so the caller should poll once to catch up.
    Connected,
    /// Work became due in `queue`.
    Wake {
        /// The queue.
        queue: String,
    },
    /// The connection was lost; signals are missed until the next `Connected`.
    Disconnected,
}
