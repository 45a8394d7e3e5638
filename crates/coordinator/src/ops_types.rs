//! The values of the operator's calls ([`crate::Operations`]): listing and reading items,
//! the queue overview, the instances, pausing queues and bulk actions. One params struct in
//! and one outcome struct out per method, as on the workers' seam. The outcomes serialize to
//! JSON (durations as seconds), for a command line's `--json` and a dashboard.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::types::{InstanceId, QueueCount, WorkId, WorkState};

/// Items on a page of [`list_work`](crate::Operations::list_work) unless the caller says.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
/// The largest page of [`list_work`](crate::Operations::list_work).
pub const MAX_PAGE_SIZE: u32 = 500;
/// The most rows one `list_work` call examines (reads by primary key and filters); a
/// selective filter may return a short page with a cursor when it runs out.
pub const LIST_SCAN_BUDGET: u32 = 10_000;
/// The most items one bulk call acts on (`bulk_work`'s ids, `bulk_work_matching`'s limit).
pub const MAX_BULK_BATCH: u32 = 1_000;
/// How many of the newest items of each finished state `queue_overview` reads: below it the
/// finished counts and rates are exact, above it they are bounds and estimates.
pub const OVERVIEW_SAMPLE: u64 = 10_000;
/// The longest `error_contains` filter accepted, in bytes.
pub const MAX_FILTER_TEXT_BYTES: usize = 1024;

fn secs<S: Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

// ---------------------------------------------------------------------------------------------
// the filter

/// Which work items an operator means: every criterion set must hold (an empty list or `None`
/// does not filter). Build it with the methods:
///
/// ```
/// use workpump_coordinator::{WorkFilter, WorkState};
/// let dead_in_q = WorkFilter::new().queue("q").state(WorkState::Dead);
/// assert!(!dead_in_q.is_empty());
/// let invoices = WorkFilter::new().kind("invoice");
/// assert_eq!(invoices.kinds, ["invoice"]);
/// assert!(WorkFilter::new().is_empty());
/// ```
///
/// It is `#[non_exhaustive]` so that criteria can be added (an item's ordering key) without
/// breaking callers. The store receives it as a JSON object (its serde form), so a
/// new criterion is a new key there too.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkFilter {
    /// The item's queue is one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<String>,
    /// Its state is one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<WorkState>,
    /// Its job kind is one of these (an untyped item matches none). Each is a valid kind: 1 to
    /// [`MAX_KIND_CHARS`](crate::MAX_KIND_CHARS) characters without control characters.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Its ordering key is one of these (an unkeyed item matches none; docs/ordering.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ordering_keys: Vec<String>,
    /// Its current owner (so only running items match).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceId>,
    /// Created at or after this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_since: Option<DateTime<Utc>>,
    /// Created before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// Finished at or after this time (so only finished items match).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_since: Option<DateTime<Utc>>,
    /// Finished before this time (so only finished items match).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_before: Option<DateTime<Utc>>,
    /// Some entry of its error history contains this text, case-insensitively. Not empty, at
    /// most [`MAX_FILTER_TEXT_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
}

impl WorkFilter {
    /// A filter that matches every item.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queues.push(queue.into());
        self
    }

    /// Adds a state.
    pub fn state(mut self, state: WorkState) -> Self {
        self.states.push(state);
        self
    }

    /// Adds a job kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kinds.push(kind.into());
        self
    }

    /// Adds an ordering key (see [`ordering_keys`](WorkFilter#structfield.ordering_keys)).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_keys.push(key.into());
        self
    }

    /// Only items this instance owns now.
    pub fn instance(mut self, instance: InstanceId) -> Self {
        self.instance = Some(instance);
        self
    }

    /// Created in `[since, before)`; either end may be open (`None`).
    pub fn created(mut self, since: Option<DateTime<Utc>>, before: Option<DateTime<Utc>>) -> Self {
        self.created_since = since;
        self.created_before = before;
        self
    }

    /// Finished in `[since, before)`; either end may be open (`None`).
    pub fn finished(mut self, since: Option<DateTime<Utc>>, before: Option<DateTime<Utc>>) -> Self {
        self.finished_since = since;
        self.finished_before = before;
        self
    }

    /// Some entry of the error history contains `text` (case-insensitive).
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Whether it matches every item (a bulk action then needs `all`).
    pub fn is_empty(&self) -> bool {
        self == &WorkFilter::default()
    }

    /// Checks what the store would refuse, or could never match: an empty or oversized
    /// `error_contains`, or one with a NUL character; a kind that no item can have.
    pub fn validate(&self, what: &str) -> Result<()> {
        for kind in &self.kinds {
            crate::validate::validate_kind(kind).map_err(|e| match e {
                Error::InvalidArgument(why) => {
                    Error::InvalidArgument(format!("{what}: filter key 'kinds': {why}"))
                }
                other => other,
            })?;
        }
        for key in &self.ordering_keys {
            crate::validate::validate_ordering_key(key).map_err(|e| match e {
                Error::InvalidArgument(why) => {
                    Error::InvalidArgument(format!("{what}: filter key 'ordering_keys': {why}"))
                }
                other => other,
            })?;
        }
        if let Some(text) = &self.error_contains {
            if text.is_empty() || text.len() > MAX_FILTER_TEXT_BYTES || text.contains('\0') {
                return Err(Error::InvalidArgument(format!(
                    "{what}: filter key 'error_contains' must be 1 to {MAX_FILTER_TEXT_BYTES} bytes without NUL, got {} bytes",
                    text.len()
                )));
            }
        }
        Ok(())
    }

    /// Whether an item with these fields matches (the fake's copy of the store's
    /// `work_matches`).
    #[cfg(feature = "testing")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matches(
        &self,
        queue: &str,
        kind: Option<&str>,
        ordering_key: Option<&str>,
        state: WorkState,
        owner: Option<InstanceId>,
        created_at: DateTime<Utc>,
        finished_at: Option<DateTime<Utc>>,
        errors: &[Value],
    ) -> bool {
        let finished_in = |bound: Option<DateTime<Utc>>, after: bool| match bound {
            None => true,
            Some(b) => finished_at.is_some_and(|f| if after { f >= b } else { f < b }),
        };
        (self.queues.is_empty() || self.queues.iter().any(|q| q == queue))
            && (self.states.is_empty() || self.states.contains(&state))
            && (self.kinds.is_empty() || kind.is_some_and(|k| self.kinds.iter().any(|x| x == k)))
            && (self.ordering_keys.is_empty()
                || ordering_key.is_some_and(|k| self.ordering_keys.iter().any(|x| x == k)))
            && self.instance.is_none_or(|i| owner == Some(i))
            && self.created_since.is_none_or(|b| created_at >= b)
            && self.created_before.is_none_or(|b| created_at < b)
            && finished_in(self.finished_since, true)
            && finished_in(self.finished_before, false)
            && self.error_contains.as_ref().is_none_or(|needle| {
                let needle = needle.to_lowercase();
                errors.iter().any(|e| {
                    e["error"]
                        .as_str()
                        .is_some_and(|t| t.to_lowercase().contains(&needle))
                })
            })
    }
}

/// The opaque page cursor: `v1.<id>` (the scan goes on below that id). The store makes it
/// (`parse_work_cursor` reads it back); the fake makes it here.
#[cfg(feature = "testing")]
pub(crate) fn encode_cursor(id: WorkId) -> String {
    format!("v1.{id}")
}

/// Reads a cursor made by the store (`v1.<id>`); anything else is refused as the store refuses it.
pub(crate) fn decode_cursor(what: &str, cursor: &str) -> Result<WorkId> {
    let digits = cursor.strip_prefix("v1.").unwrap_or("");
    let ok = !digits.is_empty()
        && digits.len() <= 19
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit());
    match digits.parse::<i64>() {
        Ok(id) if ok => Ok(id),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: malformed cursor {:?} (pass the next_cursor of the previous page, or none for the first page)",
            cursor.chars().take(100).collect::<String>()
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// list_work

/// One page of work items, newest first.
#[derive(Clone, Debug, Default)]
pub struct ListWorkParams {
    /// Which items. **Default: all.**
    pub filter: WorkFilter,
    /// `None` for the first page, then the previous page's
    /// [`next_cursor`](ListWorkOutcome::next_cursor). A malformed cursor is an
    /// [`Error::InvalidArgument`].
    pub cursor: Option<String>,
    /// 1 to [`MAX_PAGE_SIZE`]. **Default: [`DEFAULT_PAGE_SIZE`] (50).**
    pub page_size: Option<u32>,
}

impl ListWorkParams {
    pub(crate) fn validate(&self) -> Result<u32> {
        self.filter.validate("list_work")?;
        if let Some(cursor) = &self.cursor {
            decode_cursor("list_work", cursor)?;
        }
        let size = self.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if size == 0 || size > MAX_PAGE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "list_work: page_size must be between 1 and {MAX_PAGE_SIZE}, got {size}"
            )));
        }
        Ok(size)
    }
}

/// A work item in a list: what a table row shows (no payload).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkSummary {
    /// The id.
    pub id: WorkId,
    /// Its queue.
    pub queue: String,
    /// Its job kind (`None`: untyped).
    pub kind: Option<String>,
    /// Its ordering key (`None`: unordered).
    pub ordering_key: Option<String>,
    /// Its state.
    pub state: WorkState,
    /// Its priority (lower runs first).
    pub priority: i16,
    /// Attempts started.
    pub attempt: i32,
    /// Attempts it may have.
    pub max_attempts: i32,
    /// When it became (or becomes) due.
    pub run_at: DateTime<Utc>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it finished (completed, dead, cancelled).
    pub finished_at: Option<DateTime<Utc>>,
    /// The instance holding its lease (running items).
    pub instance: Option<InstanceId>,
    /// When that lease runs out.
    pub lease_expiry: Option<DateTime<Utc>>,
    /// An operator asked to cancel it.
    pub cancel_requested: bool,
    /// The text of the newest entry of its error history.
    pub last_error: Option<String>,
}

/// The result of `list_work`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ListWorkOutcome {
    /// The matching items of the page, newest first.
    pub items: Vec<WorkSummary>,
    /// Where the next page starts; `None` when the scan reached the oldest item. It means
    /// more rows remain to examine, not that more match.
    pub next_cursor: Option<String>,
    /// The page is short because the call examined [`LIST_SCAN_BUDGET`] rows, not because the
    /// matches ran out: ask again with `next_cursor`.
    pub scan_exhausted: bool,
}

// ---------------------------------------------------------------------------------------------
// get_work

/// Reads one whole work item.
#[derive(Clone, Copy, Debug)]
pub struct GetWorkParams {
    /// The item.
    pub id: WorkId,
}

/// One entry of an item's history: a failed attempt, a lease that expired, a cancel, an
/// operator's retry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The attempt it concerns.
    pub attempt: i64,
    /// When (the store's clock).
    pub at: Option<DateTime<Utc>>,
    /// The instance that held the attempt, when one did.
    pub instance: Option<String>,
    /// `failed`, `rejected`, `cancelled`, `lease_expired`, `released` or `retried`.
    pub kind: String,
    /// The error, or what happened.
    pub error: String,
}

impl HistoryEntry {
    pub(crate) fn from_json(v: &Value) -> Self {
        HistoryEntry {
            attempt: v["attempt"].as_i64().unwrap_or(-1),
            at: v["at"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
            instance: v["instance"].as_str().map(str::to_owned),
            kind: v["kind"].as_str().unwrap_or_default().to_owned(),
            error: v["error"].as_str().unwrap_or_default().to_owned(),
        }
    }
}

/// A whole work item.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkDetail {
    /// The id.
    pub id: WorkId,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: WorkState,
    /// Its priority.
    pub priority: i16,
    /// Attempts started.
    pub attempt: i32,
    /// Attempts it may have.
    pub max_attempts: i32,
    /// When it became (or becomes) due.
    pub run_at: DateTime<Utc>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// The lease's owner.
    pub instance: Option<InstanceId>,
    /// The lease's expiry.
    pub lease_expiry: Option<DateTime<Utc>>,
    /// The token of the latest claim.
    pub claim_token: Option<i64>,
    /// Renewals of the current claim.
    pub renewals: i32,
    /// An operator asked to cancel it.
    pub cancel_requested: bool,
    /// Its job kind (`None`: untyped).
    pub kind: Option<String>,
    /// Its payload.
    pub payload: Value,
    /// The metadata object its enqueuer attached (the trace context), if any.
    pub metadata: Option<Value>,
    /// The checkpoint an attempt saved.
    pub checkpoint: Option<Value>,
    /// Every entry of its history, oldest first.
    pub history: Vec<HistoryEntry>,
    /// Its unique key.
    pub unique_key: Option<String>,
    /// Its ordering key (docs/ordering.md).
    pub ordering_key: Option<String>,
}

/// The result of `get_work`. An unknown id is [`Error::NotFound`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GetWorkOutcome {
    /// The item.
    pub item: WorkDetail,
    /// The store's clock as it read the item (compute ages against this, not the caller's).
    pub now: DateTime<Utc>,
}

// ---------------------------------------------------------------------------------------------
// queue_overview

/// Asks for the overview of every queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueOverviewParams {}

/// A count that may be a lower bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    /// How many.
    pub items: u64,
    /// False: at least `items` (only the newest [`OVERVIEW_SAMPLE`] were counted).
    pub exact: bool,
}

/// A rate per minute over the last hour that may be an estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rate {
    /// Per minute.
    pub per_minute: f64,
    /// False: estimated from the newest [`OVERVIEW_SAMPLE`] items, which span less than the
    /// hour.
    pub exact: bool,
}

/// One queue in the overview.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueOverview {
    /// The queue.
    pub queue: String,
    /// It was registered (an unregistered one only holds old items).
    pub registered: bool,
    /// Claims skip it.
    pub paused: bool,
    /// Its default attempt limit (`None` when unregistered).
    pub max_attempts: Option<i32>,
    /// The service that owns its settings (`None`: nobody).
    pub owner: Option<String>,
    /// Due and waiting (exact).
    pub available: u64,
    /// Waiting for their time (exact).
    pub scheduled: u64,
    /// Leased or orphaned (exact).
    pub running: u64,
    /// Waiting behind the head of their ordering key (exact).
    pub blocked: u64,
    /// Its fleet-wide running limit, compared with `running` (`None`: unlimited;
    /// docs/flow-control.md).
    pub max_running: Option<u32>,
    /// Its fleet-wide rate limit (`None`: unlimited).
    pub rate_limit: Option<crate::RateLimit>,
    /// Completed and not yet pruned.
    pub completed: Count,
    /// Dead letters.
    pub dead: Count,
    /// Cancelled.
    pub cancelled: Count,
    /// Since when its oldest available item has been due (`None`: nothing available).
    #[serde(serialize_with = "opt_secs")]
    pub pickup_lag: Option<Duration>,
    /// Completions per minute over the last hour.
    pub completed_per_minute: Rate,
    /// Attempts that failed (retried or dead-lettered by `fail_work`) per minute over the last
    /// hour; exact (lease expiries are not counted).
    pub failed_per_minute: f64,
    /// Dead letters made per minute over the last hour.
    pub dead_per_minute: Rate,
}

/// The result of `queue_overview`: every registered queue and every other queue holding
/// items, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueOverviewOutcome {
    /// By name.
    pub queues: Vec<QueueOverview>,
    /// The store's clock as it counted.
    pub now: Option<DateTime<Utc>>,
}

impl QueueOverviewOutcome {
    /// One queue's overview.
    pub fn get(&self, queue: &str) -> Option<&QueueOverview> {
        self.queues.iter().find(|q| q.queue == queue)
    }
}

// ---------------------------------------------------------------------------------------------
// list_instances

/// Asks for every registered instance.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListInstancesParams {}

/// One registered instance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceSummary {
    /// Its id.
    pub instance: InstanceId,
    /// The host name it reported.
    pub host: String,
    /// The metadata it reported.
    pub metadata: Value,
    /// Its process id, from the metadata (`pid`), when reported.
    pub pid: Option<i64>,
    /// Its workpump version, from the metadata (`version`), when reported.
    pub version: Option<String>,
    /// When it registered.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub last_heartbeat_at: DateTime<Utc>,
    /// How long ago that was, on the store's clock.
    #[serde(serialize_with = "secs")]
    pub heartbeat_age: Duration,
    /// Some session of this database holds its alive-lock now.
    pub alive_lock_held: bool,
    /// Running items it owns.
    pub leases: u64,
    /// Those among them whose lease has run out (waiting to be reclaimed).
    pub expired_leases: u64,
    /// Its running items per queue, by queue name.
    pub in_flight: Vec<QueueCount>,
}

/// The result of `list_instances`, oldest registration first.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ListInstancesOutcome {
    /// Oldest registration first.
    pub instances: Vec<InstanceSummary>,
}

// ---------------------------------------------------------------------------------------------
// pause_queue / resume_queue

/// Pauses a queue: claims hand out none of its items until it is resumed.
#[derive(Clone, Debug)]
pub struct PauseQueueParams {
    /// A registered queue.
    pub queue: String,
}

/// The result of `pause_queue`; an unknown queue is [`Error::UnknownQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PauseQueueOutcome {
    /// False when it already was paused.
    pub changed: bool,
}

/// Resumes a paused queue and wakes its claimers.
#[derive(Clone, Debug)]
pub struct ResumeQueueParams {
    /// A registered queue.
    pub queue: String,
}

/// The result of `resume_queue`; an unknown queue is [`Error::UnknownQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ResumeQueueOutcome {
    /// False when it was not paused.
    pub changed: bool,
}

// ---------------------------------------------------------------------------------------------
// bulk_work / bulk_work_matching

/// What a bulk call does to each item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BulkAction {
    /// Retry dead letters (as `retry_dead_work`).
    Retry,
    /// Cancel waiting items, request the cancel of running ones (as `cancel_work`).
    Cancel,
    /// Delete finished items (as `discard_work`).
    Discard,
    /// Make scheduled items (delayed ones, and retries waiting out their backoff) due now:
    /// available with `run_at` = the store's now, attempts and history unchanged. What a test
    /// uses to control the clock (`workpump-test`), and an operator to skip a backoff.
    RunNow,
}

impl BulkAction {
    /// Its name in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Discard => "discard",
            BulkAction::RunNow => "run_now",
        }
    }
}

/// What a bulk call did to one item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BulkResult {
    /// A dead letter is available again.
    Retried,
    /// A waiting item is cancelled.
    Cancelled,
    /// A running item's cancel is requested.
    Requested,
    /// A finished item is deleted.
    Discarded,
    /// A scheduled item is available, due now.
    Promoted,
    /// Its state refuses the action (or, for a retry, its unique key is taken); unchanged.
    Refused {
        /// The state it is in.
        state: WorkState,
        /// Why (the single call's words).
        reason: String,
    },
    /// No such item.
    NotFound,
}

impl BulkResult {
    /// Whether the action was applied.
    pub fn applied(&self) -> bool {
        !matches!(self, BulkResult::Refused { .. } | BulkResult::NotFound)
    }
}

/// One item's answer in a bulk call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BulkItem {
    /// The item.
    pub id: WorkId,
    /// The state it had before (`None` when not found).
    pub state_before: Option<WorkState>,
    /// What happened.
    #[serde(flatten)]
    pub result: BulkResult,
}

/// An action on items named by id.
#[derive(Clone, Debug)]
pub struct BulkWorkParams {
    /// What to do.
    pub action: BulkAction,
    /// At most [`MAX_BULK_BATCH`] ids; a repeated id is answered once.
    pub ids: Vec<WorkId>,
}

impl BulkWorkParams {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.ids.len() > MAX_BULK_BATCH as usize {
            return Err(Error::InvalidArgument(format!(
                "bulk_work: at most {MAX_BULK_BATCH} ids per call, got {} (split them into batches)",
                self.ids.len()
            )));
        }
        Ok(())
    }
}

/// The result of `bulk_work`: one entry per distinct id, in the order of its first mention.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BulkWorkOutcome {
    /// Per distinct id.
    pub items: Vec<BulkItem>,
}

/// An action on the items a filter matches, one bounded batch.
#[derive(Clone, Debug)]
pub struct BulkWorkMatchingParams {
    /// What to do.
    pub action: BulkAction,
    /// Which items; an empty filter is refused unless `all`.
    pub filter: WorkFilter,
    /// Allows an empty filter (every item the action applies to).
    pub all: bool,
    /// Items acted on at most, 1 to [`MAX_BULK_BATCH`].
    pub limit: u32,
}

impl BulkWorkMatchingParams {
    /// `action` on what `filter` matches, in batches of [`MAX_BULK_BATCH`].
    pub fn new(action: BulkAction, filter: WorkFilter) -> Self {
        BulkWorkMatchingParams {
            action,
            filter,
            all: false,
            limit: MAX_BULK_BATCH,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        self.filter.validate("bulk_work_matching")?;
        if self.limit == 0 || self.limit > MAX_BULK_BATCH {
            return Err(Error::InvalidArgument(format!(
                "bulk_work_matching: limit must be between 1 and {MAX_BULK_BATCH}, got {}",
                self.limit
            )));
        }
        if self.filter.is_empty() && !self.all {
            return Err(Error::InvalidArgument(format!(
                "bulk_work_matching: an empty filter matches every item; refusing to {} them all unless all is true",
                self.action.as_str()
            )));
        }
        Ok(())
    }
}

/// The result of one `bulk_work_matching` batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BulkWorkMatchingOutcome {
    /// The items acted on, by id.
    pub items: Vec<BulkItem>,
    /// More matching items were left: call again.
    pub has_more: bool,
}

/// What [`Operations::bulk_work_matching_all`](crate::Operations::bulk_work_matching_all)
/// did in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BulkTotals {
    /// Items the action was applied to.
    pub applied: u64,
    /// Items refused (a retry whose unique key was taken).
    pub refused: u64,
    /// Calls made.
    pub batches: u64,
}

// ---------------------------------------------------------------------------------------------
// set_queue_settings

/// An operator changes a queue's settings, whoever owns them, or hands the queue over.
#[derive(Clone, Debug)]
pub struct SetQueueSettingsParams {
    /// A registered queue.
    pub queue: String,
    /// Its new default attempt limit (1 to 1 000); `None` keeps it.
    pub max_attempts: Option<i32>,
    /// `Some(Some(service))` hands the settings to that service, `Some(None)` to nobody (the
    /// next named declarer adopts them), `None` keeps the owner.
    pub owner: Option<Option<String>>,
    /// What a dead head of an ordering key does from now on (docs/ordering.md); `None` keeps
    /// it.
    pub ordering_dead_head: Option<crate::OrderingDeadHead>,
    /// The fleet-wide running limit (docs/flow-control.md): `Some(Some(n))` sets it,
    /// `Some(None)` removes it (unlimited), `None` keeps it.
    pub max_running: Option<Option<u32>>,
    /// The fleet-wide rate limit (docs/flow-control.md): `Some(Some(rate))` sets it (a changed
    /// rate starts with a full bucket), `Some(None)` removes it, `None` keeps it.
    pub rate_limit: Option<Option<crate::RateLimit>>,
}

impl SetQueueSettingsParams {
    /// Changes nothing yet: add the settings to change.
    pub fn new(queue: impl Into<String>) -> Self {
        SetQueueSettingsParams {
            queue: queue.into(),
            max_attempts: None,
            owner: None,
            ordering_dead_head: None,
            max_running: None,
            rate_limit: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(m) = self.max_attempts {
            crate::validate::validate_max_attempts(m)?;
        }
        crate::validate::validate_owner(
            "set_queue_settings",
            self.owner.as_ref().and_then(|o| o.as_deref()),
        )?;
        crate::validate::validate_flow_limits(
            "set_queue_settings",
            self.max_running.flatten(),
            self.rate_limit.flatten(),
        )
    }
}

/// The result of `set_queue_settings`: the settings as stored now. An unknown queue is
/// [`Error::UnknownQueue`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetQueueSettingsOutcome {
    /// The service that owns them.
    pub owner: Option<String>,
    /// The queue's default attempt limit.
    pub max_attempts: i32,
    /// What a dead head of an ordering key does in the queue.
    pub ordering_dead_head: crate::OrderingDeadHead,
    /// The fleet-wide running limit (`None`: unlimited).
    pub max_running: Option<u32>,
    /// The fleet-wide rate limit (`None`: unlimited).
    pub rate_limit: Option<crate::RateLimit>,
}

// ---------------------------------------------------------------------------------------------
// list_held_keys

/// Lists the ordering keys held by a dead head (queues whose `ordering_dead_head` is `hold`).
#[derive(Clone, Debug)]
pub struct ListHeldKeysParams {
    /// One queue, or `None` for every queue.
    pub queue: Option<String>,
    /// At most this many keys, 1 to 10 000. **Default: 100.**
    pub limit: u32,
}

impl Default for ListHeldKeysParams {
    fn default() -> Self {
        ListHeldKeysParams {
            queue: None,
            limit: 100,
        }
    }
}

impl ListHeldKeysParams {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(q) = &self.queue {
            crate::validate::validate_queue_name(q)?;
        }
        if !(1..=crate::MAX_SWEEP_BATCH).contains(&self.limit) {
            return Err(Error::InvalidArgument(format!(
                "list_held_keys: limit must be between 1 and {}, got {}",
                crate::MAX_SWEEP_BATCH,
                self.limit
            )));
        }
        Ok(())
    }
}

/// One ordering key held by a dead letter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldKey {
    /// Its queue.
    pub queue: String,
    /// The key.
    pub ordering_key: String,
    /// The dead letter that holds it (its lowest-id one): retry it (`retry_dead_work`) or
    /// discard it (`discard_work`) to release the key.
    pub dead_id: WorkId,
    /// Items of the key waiting behind it.
    pub blocked: u64,
}

/// The result of `list_held_keys`: the keys in id order of their dead letter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ListHeldKeysOutcome {
    /// The held keys.
    pub keys: Vec<HeldKey>,
}
