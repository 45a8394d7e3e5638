//! The end-of-scenario checks, read from the database after every worker stopped.
//!
//! Sources: the items (`workpump.work`), the audit of every change the store made to them
//! (`workpump_audit`, written by a trigger, so no code path can skip it), the workers' ledger of
//! executions, the transactional effects, the suite's cancel requests. Each audit row is one
//! change, classified as:
//!
//! - **claim** — the claim token changed (only `claim_work` mints tokens); a reclaim of an
//!   orphan also appends the `lease_expired` entry that ends the previous claim, unless the
//!   release before it wrote that entry;
//! - **outcome** — a running item left `running` under the same token through an execution's
//!   write: completed, failed (retry / dead letter / cancelled), or released by a drain;
//! - **store end** — a running orphan ended by the store (`lease_expired` entry: attempts
//!   used up, or a cancel requested);
//! - **release** — a lease freed by a sweep (owner set to NULL): a dead instance's (no
//!   entry), or one that lapsed under a live owner (`lease_expired` entry, "stopped renewing",
//!   which ends the claim);
//! - **operator cancel**, **promotion** — a waiting (or blocked) item cancelled, a scheduled
//!   one due or a blocked one made its ordering key's head.
//!
//! What a double-recorded outcome would leave behind, and the check that looks for it:
//! a second outcome row for one claim token; an outcome written by a process that never
//! claimed that token (a zombie whose write passed the fence), or on a lease whose owner was
//! no longer the claim's instance (a released or reclaimed lease); a completion whose claim
//! has no execution in the ledger; an effect row too many, or one stamped with another
//! claim's token; an error history with more or fewer entries than the claims that ended
//! without completing; an attempt count that is not the number of claims minus the drains
//! that gave their attempt back.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde_json::Value;
use sqlx::types::Uuid;
use sqlx::PgPool;

use super::{Result, SUITE_APP};

/// One work item at the end.
pub(crate) struct Item {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) state: String,
    pub(crate) attempt: i32,
    pub(crate) token: Option<i64>,
    pub(crate) errors: Vec<Value>,
}

/// One audited change.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct Change {
    /// `insert`, `update` or `delete`.
    pub(crate) op: String,
    pub(crate) item: i64,
    /// `-` before an insert.
    pub(crate) from_state: String,
    /// `-` after a delete.
    pub(crate) to_state: String,
    pub(crate) from_instance: Option<Uuid>,
    pub(crate) to_instance: Option<Uuid>,
    pub(crate) from_token: Option<i64>,
    pub(crate) to_token: Option<i64>,
    pub(crate) from_attempt: i32,
    pub(crate) to_attempt: i32,
    /// Lease expiry before and after (database seconds).
    pub(crate) from_expiry: Option<f64>,
    pub(crate) to_expiry: Option<f64>,
    pub(crate) from_renewals: i32,
    pub(crate) to_renewals: i32,
    /// The checkpoint changed.
    pub(crate) checkpointed: bool,
    pub(crate) from_cancel: bool,
    pub(crate) to_cancel: bool,
    pub(crate) error: Option<Value>,
    pub(crate) proc: String,
    /// When the row changed (database seconds).
    pub(crate) at: f64,
    /// The writing transaction's `now()` (database seconds): the clock the store's
    /// functions compare a lease's expiry with.
    pub(crate) txn_at: f64,
}

/// What kind of change an audit row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The item was enqueued.
    Insert,
    /// The item's row was deleted: nothing in a scenario may delete one.
    Delete,
    Claim,
    Outcome,
    StoreEnd,
    Release,
    /// A lease extended (`renew_leases`).
    Renewal,
    /// A checkpoint saved (`checkpoint_work`).
    Checkpoint,
    /// `cancel_work` on a running item.
    CancelRequest,
    OperatorCancel,
    Promotion,
    Unexpected,
}

impl Change {
    pub(crate) fn kind(&self) -> Kind {
        match self.op.as_str() {
            "insert" => return Kind::Insert,
            "delete" => return Kind::Delete,
            _ => {}
        }
        if self.to_token != self.from_token {
            return Kind::Claim;
        }
        let error_kind = self
            .error
            .as_ref()
            .and_then(|e| e.get("kind"))
            .and_then(Value::as_str);
        match (self.from_state.as_str(), self.to_state.as_str()) {
            ("running", "running")
                if self.to_instance.is_none() && self.from_instance.is_some() =>
            {
                Kind::Release
            }
            ("running", "running")
                if self.from_instance.is_some() && self.from_instance == self.to_instance =>
            {
                let renewed = self.to_expiry != self.from_expiry
                    && self.to_renewals == self.from_renewals + 1;
                let expiry_kept =
                    self.to_expiry == self.from_expiry && self.to_renewals == self.from_renewals;
                let cancel_changed = self.to_cancel != self.from_cancel;
                match (renewed, self.checkpointed, cancel_changed) {
                    (true, false, false) => Kind::Renewal,
                    (false, true, false) if expiry_kept => Kind::Checkpoint,
                    (false, false, true) if expiry_kept && self.to_cancel => Kind::CancelRequest,
                    _ => Kind::Unexpected,
                }
            }
            ("running", "running") => Kind::Unexpected,
            ("running", _) if error_kind == Some("lease_expired") => Kind::StoreEnd,
            ("running", _) => Kind::Outcome,
            // A blocked item becomes its key's head when the head before it ended.
            ("scheduled" | "blocked", "available") | ("blocked", "scheduled") => Kind::Promotion,
            ("available" | "scheduled" | "blocked", "cancelled") => Kind::OperatorCancel,
            _ => Kind::Unexpected,
        }
    }

    fn error_attempt(&self) -> Option<i32> {
        self.error
            .as_ref()
            .and_then(|e| e.get("attempt"))
            .and_then(Value::as_i64)
            .map(|a| a as i32)
    }
}

/// One execution from the ledger.
pub(crate) struct Exec {
    pub(crate) item: i64,
    pub(crate) attempt: i32,
    pub(crate) token: i64,
    pub(crate) instance: Uuid,
    pub(crate) proc: String,
}

/// A registration, deletion or eviction tombstone of an instance (`workpump_instance_audit`).
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct InstanceEvent {
    /// `register`, `delete` or `tombstone`.
    pub(crate) op: String,
    pub(crate) instance: Uuid,
    /// The instance's own process (its `host`); None on a tombstone.
    pub(crate) host: Option<String>,
    /// The writing process.
    pub(crate) proc: String,
    /// Database seconds.
    pub(crate) at: f64,
    /// How old its heartbeat was then.
    pub(crate) heartbeat_age: Option<f64>,
    /// Whether it was lock-proven (`alive_lock`).
    pub(crate) alive_lock: Option<bool>,
    /// How long ago a sweep first saw its lock missing.
    pub(crate) lock_lost_for: Option<f64>,
    /// Whether some session held its lock when the row was deleted.
    pub(crate) lock_held: Option<bool>,
    /// Seconds since the server's postmaster started.
    pub(crate) since_server_start: f64,
}

/// Everything the checks read.
pub(crate) struct Evidence {
    pub(crate) items: Vec<Item>,
    pub(crate) changes: Vec<Change>,
    pub(crate) execs: Vec<Exec>,
    /// Effects: item → (token stamped, writing process), one entry per row.
    pub(crate) effects: HashMap<i64, Vec<(Option<i64>, String)>>,
    /// The suite's cancel requests: item → answer.
    pub(crate) cancels: HashMap<i64, String>,
    /// Reaped instances: id → when (database seconds).
    pub(crate) evicted: HashMap<Uuid, f64>,
    /// The ids the suite enqueued.
    pub(crate) enqueued: Vec<i64>,
    /// Registrations, deletions and eviction tombstones of instances, in order.
    pub(crate) instance_events: Vec<InstanceEvent>,
}

impl Evidence {
    pub(crate) async fn load(pool: &PgPool) -> Result<Evidence> {
        let items = sqlx::query_as::<_, (i64, String, String, i32, Option<i64>, Value)>(
            "SELECT id, coalesce(payload->>'kind', 'noop'), state::text, attempt, claim_token, errors
             FROM workpump.work_all ORDER BY id",
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|(id, kind, state, attempt, token, errors)| Item {
            id,
            kind,
            state,
            attempt,
            token,
            errors: match errors {
                Value::Array(entries) => entries,
                other => vec![other],
            },
        })
        .collect();
        let changes = sqlx::query_as::<_, Change>(
            "SELECT op, item, coalesce(from_state, '-') AS from_state,
                    coalesce(to_state, '-') AS to_state, from_instance, to_instance,
                    from_token, to_token, coalesce(from_attempt, 0) AS from_attempt,
                    coalesce(to_attempt, 0) AS to_attempt,
                    extract(epoch FROM from_expiry)::float8 AS from_expiry,
                    extract(epoch FROM to_expiry)::float8 AS to_expiry,
                    coalesce(from_renewals, 0) AS from_renewals,
                    coalesce(to_renewals, 0) AS to_renewals, checkpointed,
                    coalesce(from_cancel, false) AS from_cancel,
                    coalesce(to_cancel, false) AS to_cancel, error, proc,
                    extract(epoch FROM at)::float8 AS at,
                    extract(epoch FROM txn_at)::float8 AS txn_at
             FROM workpump_audit ORDER BY seq",
        )
        .fetch_all(pool)
        .await?;
        let execs = sqlx::query_as::<_, (i64, i32, i64, Uuid, String)>(
            "SELECT item, attempt, token, instance, proc FROM workpump_ledger ORDER BY at",
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|(item, attempt, token, instance, proc)| Exec {
            item,
            attempt,
            token,
            instance,
            proc,
        })
        .collect();
        let mut effects: HashMap<i64, Vec<(Option<i64>, String)>> = HashMap::new();
        for (item, token, proc) in sqlx::query_as::<_, (i64, Option<i64>, String)>(
            "SELECT item, token, proc FROM workpump_effects",
        )
        .fetch_all(pool)
        .await?
        {
            effects.entry(item).or_default().push((token, proc));
        }
        let cancels =
            sqlx::query_as::<_, (i64, String)>("SELECT item, result FROM workpump_cancels")
                .fetch_all(pool)
                .await?
                .into_iter()
                .collect();
        let evicted = sqlx::query_as::<_, (Uuid, f64)>(
            "SELECT instance_id, extract(epoch FROM evicted_at)::float8 FROM workpump.evicted_instances",
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .collect();
        let enqueued = sqlx::query_scalar("SELECT item FROM workpump_enqueued ORDER BY item")
            .fetch_all(pool)
            .await?;
        let instance_events = sqlx::query_as::<_, InstanceEvent>(
            "SELECT op, instance, host, proc, extract(epoch FROM at)::float8 AS at,
                    extract(epoch FROM at - last_heartbeat_at)::float8 AS heartbeat_age,
                    alive_lock,
                    extract(epoch FROM at - lock_lost_at)::float8 AS lock_lost_for,
                    lock_held,
                    extract(epoch FROM at - postmaster_start)::float8 AS since_server_start
             FROM workpump_instance_audit ORDER BY seq",
        )
        .fetch_all(pool)
        .await?;
        Ok(Evidence {
            items,
            changes,
            execs,
            effects,
            cancels,
            evicted,
            enqueued,
            instance_events,
        })
    }

    /// The changes of one item, in order.
    pub(crate) fn changes_of(&self, item: i64) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(move |c| c.item == item)
    }
}

/// What the checks found.
#[derive(Default)]
pub(crate) struct Verdict {
    pub(crate) completed: usize,
    pub(crate) dead: usize,
    pub(crate) cancelled: usize,
    /// Items that did not end as designed (unfinished, or dead / cancelled without cause).
    pub(crate) lost: Vec<String>,
    /// Evidence of an outcome recorded twice or by the wrong claim.
    pub(crate) double: Vec<String>,
    /// Transactional effects missing, doubled, or from the wrong claim.
    pub(crate) effects: Vec<String>,
    /// Histories inconsistent with the claims (attempt counts, error entries, unexpected
    /// transitions, executions under claims the store never made, items the suite did not
    /// enqueue).
    pub(crate) history: Vec<String>,
    /// Writes the fence should have refused, or that nobody asked for: a renewal by a
    /// process that did not hold the lease under its token, or of a lease that had expired;
    /// a checkpoint under a claim that was not the current one; a cancel request the suite
    /// did not make.
    pub(crate) fence: Vec<String>,
    /// Executions in the ledger.
    pub(crate) executions: usize,
    /// Items executed more than once (at-least-once at work).
    pub(crate) redelivered: usize,
    /// Executions whose claim recorded no outcome of its own (fenced out, abandoned, killed).
    pub(crate) unrecorded: usize,
    /// Claims of orphans (expired or released leases).
    pub(crate) reclaims: usize,
    /// Entries `lease expired: the owning instance stopped renewing` (a lease that lapsed
    /// while its owner was registered).
    pub(crate) lapsed: usize,
}

impl Verdict {
    /// Every violation found, of every kind (an empty run is one: see [`check`]).
    pub(crate) fn violations(&self) -> impl Iterator<Item = &String> {
        self.lost
            .iter()
            .chain(&self.double)
            .chain(&self.effects)
            .chain(&self.history)
            .chain(&self.fence)
    }
}

/// Runs every check. `t0` (database seconds) is the origin of the times quoted in evidence.
pub(crate) fn check(ev: &Evidence, t0: f64) -> Verdict {
    let mut v = Verdict::default();
    let mut by_item: HashMap<i64, Vec<&Change>> = HashMap::new();
    for c in &ev.changes {
        by_item.entry(c.item).or_default().push(c);
    }
    let mut execs_by_item: HashMap<i64, Vec<&Exec>> = HashMap::new();
    for e in &ev.execs {
        execs_by_item.entry(e.item).or_default().push(e);
    }
    v.executions = ev.execs.len();
    let none = Vec::new();
    let none_execs = Vec::new();

    // Every item the suite enqueued is still there, and nothing else is.
    if ev.enqueued.is_empty() {
        v.lost.push(
            "the suite enqueued nothing (workpump_enqueued is empty): every check below would \
             pass vacuously"
                .to_owned(),
        );
    }
    let present: std::collections::HashSet<i64> = ev.items.iter().map(|i| i.id).collect();
    let enqueued: std::collections::HashSet<i64> = ev.enqueued.iter().copied().collect();
    for id in ev.enqueued.iter().filter(|id| !present.contains(id)) {
        let deleted = by_item
            .get(id)
            .and_then(|cs| cs.iter().find(|c| c.kind() == Kind::Delete))
            .map(|c| {
                format!(
                    "deleted by {} at {:+.3}s while {}",
                    c.proc,
                    c.at - t0,
                    c.from_state
                )
            })
            .unwrap_or_else(|| "no delete audited".to_owned());
        v.lost.push(format!(
            "item {id}: enqueued, but it is gone at the end ({deleted})"
        ));
    }
    for item in ev.items.iter().filter(|i| !enqueued.contains(&i.id)) {
        v.history.push(format!(
            "item {} ({}): at the end, but the suite never enqueued it",
            item.id, item.kind
        ));
    }

    for item in &ev.items {
        let changes = by_item.get(&item.id).unwrap_or(&none);
        let execs = execs_by_item.get(&item.id).unwrap_or(&none_execs);
        let evidence = || trail(item, changes, execs, t0);
        if execs.len() > 1 {
            v.redelivered += 1;
        }

        // Replay the audit: claims, ends, outcomes.
        struct Claim {
            token: i64,
            attempt: i32,
            instance: Option<Uuid>,
            proc: String,
            outcomes: usize,
        }
        let mut claims: Vec<Claim> = Vec::new();
        let mut ended: Vec<i32> = Vec::new();
        let mut gave_back = 0i32;
        // The attempt whose lapsed lease the sweep released, with the history entry it wrote
        // (`release_lapsed_leases`): the reclaim or the store's end that follows writes none
        // of its own for it (a store end still may).
        let mut released_entry: Option<i32> = None;
        let mut entries = 0usize;
        let mut inserts = 0usize;
        // The claim an operator's cancel request reached, once one did.
        let mut cancel_under: Option<(i64, f64)> = None;
        for (n, c) in changes.iter().enumerate() {
            if c.error.is_some() {
                entries += 1;
            }
            match c.kind() {
                Kind::Insert => {
                    inserts += 1;
                    if n > 0 || c.proc != SUITE_APP {
                        v.history.push(format!(
                            "item {}: inserted by {} as change #{} (the suite enqueues every item, \
                             before anything else happens to it)\n{}",
                            item.id,
                            c.proc,
                            n + 1,
                            evidence()
                        ));
                    }
                }
                Kind::Delete => v.lost.push(format!(
                    "item {}: its row was deleted by {} at {:+.3}s (and written again)\n{}",
                    item.id,
                    c.proc,
                    c.at - t0,
                    evidence()
                )),
                Kind::Renewal | Kind::Checkpoint => {
                    let what = if c.kind() == Kind::Renewal {
                        "renewal"
                    } else {
                        "checkpoint"
                    };
                    let current = claims.last();
                    let problem = match current {
                        None => Some("before any claim".to_owned()),
                        Some(k) if Some(k.token) != c.from_token => Some(format!(
                            "under token {:?}, but the current claim is {}",
                            c.from_token, k.token
                        )),
                        Some(k) if k.proc != c.proc => Some(format!(
                            "written by {}, but claim {} is {}'s",
                            c.proc, k.token, k.proc
                        )),
                        Some(k) if k.instance != c.from_instance => Some(format!(
                            "on a lease owned by {:?}, not by the claim's instance {:?}",
                            c.from_instance, k.instance
                        )),
                        _ => None,
                    };
                    let expired =
                        c.kind() == Kind::Renewal && c.from_expiry.is_none_or(|e| e < c.txn_at);
                    if let Some(problem) = problem {
                        v.fence.push(format!(
                            "item {}: a {what} at {:+.3}s {problem}\n{}",
                            item.id,
                            c.at - t0,
                            evidence()
                        ));
                    } else if expired {
                        v.fence.push(format!(
                            "item {}: a renewal at {:+.3}s extended a lease that had expired {:.3} s \
                             earlier (renewal is conditional on expiry >= now)\n{}",
                            item.id,
                            c.at - t0,
                            c.from_expiry.map_or(f64::NAN, |e| c.txn_at - e),
                            evidence()
                        ));
                    }
                }
                Kind::CancelRequest => {
                    let asked = ev.cancels.get(&item.id).map(String::as_str);
                    if c.proc != SUITE_APP || asked != Some("requested") {
                        v.fence.push(format!(
                            "item {}: a cancel request by {} at {:+.3}s, but the suite's cancel_work \
                             answered {asked:?} for it\n{}",
                            item.id,
                            c.proc,
                            c.at - t0,
                            evidence()
                        ));
                    }
                    if cancel_under.is_none() {
                        cancel_under = c.from_token.map(|t| (t, c.at));
                    }
                }
                Kind::Claim => {
                    if let Some((token, at)) = cancel_under {
                        v.lost.push(format!(
                            "item {}: an operator's cancel reached claim {token} at {:+.3}s, but the \
                             item was claimed again at {:+.3}s instead of ending cancelled (the \
                             cancel was lost)\n{}",
                            item.id,
                            at - t0,
                            c.at - t0,
                            evidence()
                        ));
                        cancel_under = None;
                    }
                    if c.to_attempt != c.from_attempt + 1 || c.to_state != "running" {
                        v.history.push(format!(
                            "item {}: a claim moved attempt {} -> {} into state {}\n{}",
                            item.id,
                            c.from_attempt,
                            c.to_attempt,
                            c.to_state,
                            evidence()
                        ));
                    }
                    if c.from_state == "running" {
                        v.reclaims += 1;
                        match c.error_attempt() {
                            Some(a) => ended.push(a),
                            None if released_entry == Some(c.from_attempt) => {}
                            None => v.history.push(format!(
                                "item {}: an orphan was reclaimed without a history entry for the \
                                 claim it ended\n{}",
                                item.id,
                                evidence()
                            )),
                        }
                        if c.error
                            .as_ref()
                            .and_then(|e| e.get("error"))
                            .and_then(Value::as_str)
                            .is_some_and(|s| s.contains("stopped renewing"))
                        {
                            v.lapsed += 1;
                        }
                    }
                    if let Some(token) = c.to_token {
                        claims.push(Claim {
                            token,
                            attempt: c.to_attempt,
                            instance: c.to_instance,
                            proc: c.proc.clone(),
                            outcomes: 0,
                        });
                    }
                }
                Kind::Outcome => {
                    let claim = claims.iter_mut().find(|k| Some(k.token) == c.from_token);
                    match claim {
                        None => v.double.push(format!(
                            "item {}: an outcome ({} -> {}) under token {:?}, which no claim minted\n{}",
                            item.id,
                            c.from_state,
                            c.to_state,
                            c.from_token,
                            evidence()
                        )),
                        Some(claim) => {
                            claim.outcomes += 1;
                            if claim.outcomes > 1 {
                                v.double.push(format!(
                                    "item {}: claim {} recorded {} outcomes\n{}",
                                    item.id,
                                    claim.token,
                                    claim.outcomes,
                                    evidence()
                                ));
                            }
                            if claim.proc != c.proc {
                                v.double.push(format!(
                                    "item {}: the outcome {} was written by {}, but claim {} was {}'s\n{}",
                                    item.id,
                                    c.to_state,
                                    c.proc,
                                    claim.token,
                                    claim.proc,
                                    evidence()
                                ));
                            }
                            if c.from_instance != claim.instance {
                                v.double.push(format!(
                                    "item {}: the outcome {} landed on a lease owned by {:?}, not by \
                                     the claim's instance {:?}\n{}",
                                    item.id,
                                    c.to_state,
                                    c.from_instance,
                                    claim.instance,
                                    evidence()
                                ));
                            }
                            if c.to_state == "completed"
                                && !execs.iter().any(|e| e.token == claim.token)
                            {
                                v.double.push(format!(
                                    "item {}: completed under claim {}, which has no execution in \
                                     the ledger\n{}",
                                    item.id,
                                    claim.token,
                                    evidence()
                                ));
                            }
                        }
                    }
                    if let Some(a) = c.error_attempt() {
                        ended.push(a);
                    } else if c.to_state == "completed" {
                        ended.push(c.from_attempt);
                    } else {
                        // A release: a drain gives its attempt back (attempt - 1).
                        if c.to_attempt == c.from_attempt - 1 {
                            gave_back += 1;
                        }
                        ended.push(c.from_attempt);
                    }
                }
                Kind::StoreEnd => match c.error_attempt() {
                    // The release of its lapsed lease recorded this attempt's end already.
                    Some(a) if released_entry == Some(a) => {}
                    Some(a) => ended.push(a),
                    None => v.history.push(format!(
                        "item {}: the store ended an orphan without a history entry\n{}",
                        item.id,
                        evidence()
                    )),
                },
                Kind::Release => {
                    // The sweep's release of a lapsed lease writes the attempt's entry; a
                    // reap's release writes none (the reclaim does).
                    if let Some(a) = c.error_attempt() {
                        ended.push(a);
                        released_entry = Some(a);
                        if c.error
                            .as_ref()
                            .and_then(|e| e.get("error"))
                            .and_then(Value::as_str)
                            .is_some_and(|s| s.contains("stopped renewing"))
                        {
                            v.lapsed += 1;
                        }
                    }
                }
                Kind::Promotion => {}
                Kind::OperatorCancel => {
                    if !ev.cancels.contains_key(&item.id) {
                        v.lost.push(format!(
                            "item {}: cancelled while waiting, but the suite never cancelled it\n{}",
                            item.id,
                            evidence()
                        ));
                    }
                }
                Kind::Unexpected => v.history.push(format!(
                    "item {}: a change the store should never make ({} -> {}, owner {:?} -> {:?}, \
                     token {:?} -> {:?}) by {}\n{}",
                    item.id,
                    c.from_state,
                    c.to_state,
                    c.from_instance,
                    c.to_instance,
                    c.from_token,
                    c.to_token,
                    c.proc,
                    evidence()
                )),
            }
        }

        if inserts != 1 {
            v.history.push(format!(
                "item {}: {inserts} inserts audited, expected 1 (the enqueue)\n{}",
                item.id,
                evidence()
            ));
        }

        // 1. Nothing lost.
        let cancel_asked = ev.cancels.contains_key(&item.id);
        let last_kind = item
            .errors
            .last()
            .and_then(|e| e.get("kind"))
            .and_then(Value::as_str);
        match item.state.as_str() {
            "completed" => {
                v.completed += 1;
                if item.kind == "dead" {
                    v.lost.push(format!(
                        "item {}: designed to be rejected, but completed\n{}",
                        item.id,
                        evidence()
                    ));
                }
            }
            "dead" => {
                v.dead += 1;
                if item.kind != "dead" || last_kind != Some("rejected") {
                    v.lost.push(format!(
                        "item {} ({}): ended dead (last error kind {:?}) — not designed\n{}",
                        item.id,
                        item.kind,
                        last_kind,
                        evidence()
                    ));
                }
            }
            "cancelled" => {
                v.cancelled += 1;
                if !cancel_asked {
                    v.lost.push(format!(
                        "item {} ({}): ended cancelled, but nobody asked to cancel it\n{}",
                        item.id,
                        item.kind,
                        evidence()
                    ));
                }
            }
            other => v.lost.push(format!(
                "item {} ({}): never finished — still {other} at the end\n{}",
                item.id,
                item.kind,
                evidence()
            )),
        }

        // Claims against ends, attempts, entries.
        let finished = matches!(item.state.as_str(), "completed" | "dead" | "cancelled");
        if finished {
            let mut claimed: Vec<i32> = claims.iter().map(|k| k.attempt).collect();
            claimed.sort_unstable();
            ended.sort_unstable();
            if claimed != ended {
                v.history.push(format!(
                    "item {}: the claims' attempts {claimed:?} do not match the attempts that \
                     ended {ended:?} (completion, error entries, releases)\n{}",
                    item.id,
                    evidence()
                ));
            }
        }
        let expected_attempt = claims.len() as i32 - gave_back;
        if item.attempt != expected_attempt {
            v.history.push(format!(
                "item {}: attempt is {}, but {} claims minus {} drained releases make {}\n{}",
                item.id,
                item.attempt,
                claims.len(),
                gave_back,
                expected_attempt,
                evidence()
            ));
        }
        if item.errors.len() != entries {
            v.history.push(format!(
                "item {}: {} error entries, but the audited changes appended {}\n{}",
                item.id,
                item.errors.len(),
                entries,
                evidence()
            ));
        }
        if item.state == "completed" && claims.last().map(|k| k.token) != item.token {
            v.double.push(format!(
                "item {}: completed with token {:?}, which is not its last claim's\n{}",
                item.id,
                item.token,
                evidence()
            ));
        }

        // Every execution ran under a claim the store made, as that claim.
        for e in execs {
            let matched = claims.iter().any(|k| {
                k.token == e.token
                    && k.attempt == e.attempt
                    && k.instance == Some(e.instance)
                    && k.proc == e.proc
            });
            if !matched {
                v.history.push(format!(
                    "item {}: {} executed attempt {} under token {} as {}, a claim the store \
                     never made\n{}",
                    item.id,
                    e.proc,
                    e.attempt,
                    e.token,
                    e.instance,
                    evidence()
                ));
            }
        }
        v.unrecorded += claims
            .iter()
            .filter(|k| k.outcomes == 0 && execs.iter().any(|e| e.token == k.token))
            .count();

        // 3. Effects once, where transactional.
        let effects = ev.effects.get(&item.id).map(Vec::as_slice).unwrap_or(&[]);
        if item.kind == "tx" {
            let want = usize::from(item.state == "completed");
            if effects.len() != want {
                v.effects.push(format!(
                    "item {} (tx, {}): {} effect rows, expected {want}\n{}",
                    item.id,
                    item.state,
                    effects.len(),
                    evidence()
                ));
            } else if let Some((token, proc)) = effects.first() {
                if *token != item.token {
                    v.effects.push(format!(
                        "item {}: its effect was written under token {:?} (by {proc}), but it \
                         completed under {:?}\n{}",
                        item.id,
                        token,
                        item.token,
                        evidence()
                    ));
                }
            }
        } else if !effects.is_empty() {
            v.effects.push(format!(
                "item {} ({}): {} effect rows for an item that writes none",
                item.id,
                item.kind,
                effects.len()
            ));
        }
    }
    v
}

/// An item's story for a violation report: its end state, its changes and executions.
pub(crate) fn trail(item: &Item, changes: &[&Change], execs: &[&Exec], t0: f64) -> String {
    let mut s = format!(
        "    end: {} ({}), attempt {}, token {:?}, {} error entries\n",
        item.state,
        item.kind,
        item.attempt,
        item.token,
        item.errors.len()
    );
    let short = |u: Option<Uuid>| {
        u.map(|u| u.to_string()[..8].to_owned())
            .unwrap_or_else(|| "-".into())
    };
    for c in changes.iter().take(40) {
        if matches!(
            c.kind(),
            Kind::Renewal | Kind::Checkpoint | Kind::CancelRequest
        ) {
            let expiry = |e: Option<f64>| {
                e.map(|e| format!("{:+.3}s", e - t0))
                    .unwrap_or_else(|| "-".into())
            };
            let _ = writeln!(
                s,
                "    {:>+8.3}s {:<15} {:?}: token {:?}, owner {}, expiry {} -> {} (its now {:+.3}s), \
                 renewals {} -> {}, cancel requested {} -> {}",
                c.at - t0,
                c.proc,
                c.kind(),
                c.from_token,
                short(c.from_instance),
                expiry(c.from_expiry),
                expiry(c.to_expiry),
                c.txn_at - t0,
                c.from_renewals,
                c.to_renewals,
                c.from_cancel,
                c.to_cancel
            );
            continue;
        }
        let _ = writeln!(
            s,
            "    {:>+8.3}s {:<15} {:?}: {} -> {}, owner {} -> {}, token {:?} -> {:?}, attempt {} -> {}{}",
            c.at - t0,
            c.proc,
            c.kind(),
            c.from_state,
            c.to_state,
            short(c.from_instance),
            short(c.to_instance),
            c.from_token,
            c.to_token,
            c.from_attempt,
            c.to_attempt,
            c.error
                .as_ref()
                .map(|e| format!("; entry {e}"))
                .unwrap_or_default()
        );
    }
    for e in execs.iter().take(10) {
        let _ = writeln!(
            s,
            "    ledger: {} ran attempt {} under token {} as {}",
            e.proc,
            e.attempt,
            e.token,
            short(Some(e.instance))
        );
    }
    s
}

/// When the items a fault took away ran again.
pub(crate) struct Rerun {
    /// How many (item, token) pairs the fault held.
    pub(crate) affected: usize,
    /// Seconds from the fault until the last of them was claimed anew or ended.
    pub(crate) all_after: Option<f64>,
    /// How many of them a peer took over (the rest: finished by the faulty process itself
    /// after it came back, with its lease unclaimed meanwhile).
    pub(crate) by_peer: usize,
    /// Outcomes the faulty process recorded for them (legitimate only when not reclaimed).
    pub(crate) own_outcomes: usize,
    /// Orphans the faulty process claimed back itself, after it came back.
    pub(crate) own_claims: usize,
    /// The (item, token) pairs that never ran again (should be none).
    pub(crate) stuck: Vec<(i64, i64)>,
}

/// For the leases a fault at `at` took from `procs`, when each item ran again.
pub(crate) fn rerun(ev: &Evidence, at: f64, affected: &[(i64, i64)], procs: &[&str]) -> Rerun {
    let mut r = Rerun {
        affected: affected.len(),
        all_after: None,
        by_peer: 0,
        own_outcomes: 0,
        own_claims: 0,
        stuck: Vec::new(),
    };
    let mut latest: Option<f64> = None;
    for &(item, token) in affected {
        // The first change after this lease began that ends it or starts another; a release
        // (by a sweep, or by the process's own drain) only hands the item on, so it is
        // skipped. Anchored on the lease's start, not on the fault's time: the held leases are
        // read after the fault, so a write of the process that ran before the fault but
        // committed after that read (its completion, stamped before `at`) still counts.
        let next = ev
            .changes_of(item)
            .skip_while(|c| !(c.to_token == Some(token) && c.to_state == "running"))
            .skip(1)
            .find(|c| {
                (c.to_token != Some(token) || c.to_state != "running")
                    && c.kind() != Kind::Release
                    && !(c.kind() == Kind::Outcome
                        && c.error.is_none()
                        && c.to_state == "available")
            });
        match next {
            Some(c) => {
                if c.kind() == Kind::Claim {
                    if procs.contains(&c.proc.as_str()) {
                        r.own_claims += 1;
                    } else {
                        r.by_peer += 1;
                    }
                }
                if c.kind() == Kind::Outcome && procs.contains(&c.proc.as_str()) {
                    r.own_outcomes += 1;
                }
                let when = c.at.max(at);
                latest = Some(latest.map_or(when, |l: f64| l.max(when)));
            }
            None => r.stuck.push((item, token)),
        }
    }
    r.all_after = latest.map(|l| l - at);
    r
}

/// A process the suite took down: killed at `at` (`until` None), or stopped (SIGSTOP) from
/// `at` to `until`. Database seconds.
#[derive(Clone, Debug)]
pub(crate) struct Down {
    pub(crate) proc: String,
    pub(crate) at: f64,
    pub(crate) until: Option<f64>,
}

/// What the ordering-key checks found (see [`keyed`]).
#[derive(Default, Debug)]
pub(crate) struct Keyed {
    /// Claims of keyed items.
    pub(crate) claims: usize,
    /// Keyed items claimed more than once.
    pub(crate) claimed_twice: usize,
    /// Consecutive claims of one key whose first ended without an outcome of its own
    /// process, justified by that process's death (SIGKILL before the next claim).
    pub(crate) after_kill: usize,
    /// ... justified by its pause: its lease expired while it was stopped.
    pub(crate) after_stop: usize,
    /// Consecutive claims of one key made by different processes.
    pub(crate) handovers: usize,
    pub(crate) violations: Vec<String>,
}

/// The ordering-key checks. `keys` maps each keyed item to its key and its place in the
/// key's enqueue order (`ordering_seq`); `down` lists the processes the suite killed or
/// stopped. For every key, its claims (all its items', in audit order) must satisfy:
///
/// 1. **one at a time** — a claim is made only after the key's previous claim ended in the
///    store (an outcome under its token, a release of its dead owner's lease, the store
///    ending the orphan, or the reclaim itself);
/// 2. **attempt n + 1 only after attempt n ended or its process died** — when the previous
///    claim did not end by an outcome of its own process, that process was SIGKILLed before
///    the new claim, or was SIGSTOPped while its lease expired (the lease's last expiry lies
///    in the pause); anything else is a head taken from a live, running process;
/// 3. **enqueue order** — claims, and completions, follow `ordering_seq`;
/// 4. **a zombie's late outcome is fenced** — no outcome is recorded under a claim's token
///    once the key has been claimed again.
pub(crate) fn keyed(ev: &Evidence, keys: &HashMap<i64, (String, i64)>, down: &[Down]) -> Keyed {
    let mut k = Keyed::default();
    let mut per_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut claims_of: HashMap<i64, usize> = HashMap::new();
    for (n, c) in ev.changes.iter().enumerate() {
        if c.kind() == Kind::Claim && c.to_token.is_some() {
            if let Some((key, _)) = keys.get(&c.item) {
                per_key.entry(key).or_default().push(n);
                *claims_of.entry(c.item).or_default() += 1;
                k.claims += 1;
            }
        }
    }
    k.claimed_twice = claims_of.values().filter(|n| **n > 1).count();
    let seq = |item: i64| keys.get(&item).map_or(-1, |(_, s)| *s);
    for (key, claims) in &per_key {
        for pair in claims.windows(2) {
            let (first, next) = (&ev.changes[pair[0]], &ev.changes[pair[1]]);
            let token = first.to_token;
            let what = |c: &Change| {
                format!(
                    "item {} (#{} of the key) claim {:?} by {} at {:.3}",
                    c.item,
                    seq(c.item),
                    c.to_token,
                    c.proc,
                    c.at
                )
            };
            if next.proc != first.proc {
                k.handovers += 1;
            }
            if seq(next.item) < seq(first.item) {
                k.violations.push(format!(
                    "key {key}: {} came after {}, out of enqueue order",
                    what(next),
                    what(first)
                ));
            }
            // Where the first claim ended.
            let end = ev.changes[pair[0] + 1..]
                .iter()
                .enumerate()
                .find(|(_, c)| {
                    c.item == first.item
                        && c.from_token == token
                        && matches!(
                            c.kind(),
                            Kind::Outcome | Kind::StoreEnd | Kind::Release | Kind::Claim
                        )
                })
                .map(|(d, c)| (pair[0] + 1 + d, c));
            let Some((end_at, end)) = end.filter(|(n, _)| *n <= pair[1]) else {
                k.violations.push(format!(
                    "key {key}: {} while {} had not ended (two claims of one key at once)",
                    what(next),
                    what(first)
                ));
                continue;
            };
            // A zombie's write under the first claim's token after the key moved on.
            for late in ev.changes[end_at + 1..]
                .iter()
                .filter(|c| c.item == first.item && c.from_token == token)
                .filter(|c| c.kind() == Kind::Outcome)
            {
                k.violations.push(format!(
                    "key {key}: {} recorded {} under token {:?} at {:.3}, after the claim had \
                     ended (a zombie's late outcome passed the fence)",
                    late.proc, late.to_state, token, late.at
                ));
            }
            if end.kind() == Kind::Outcome && end.proc == first.proc {
                continue;
            }
            // The first claim was taken from its process: it must have been dead or paused.
            let expiry = ev.changes[pair[0]..end_at]
                .iter()
                .filter(|c| c.item == first.item && c.to_token == token)
                .rev()
                .find_map(|c| c.to_expiry);
            let killed = down
                .iter()
                .any(|d| d.proc == first.proc && d.until.is_none() && d.at <= next.at);
            let paused = down.iter().any(|d| {
                d.proc == first.proc
                    && d.until.is_some_and(|until| {
                        d.at <= next.at && expiry.is_some_and(|e| e >= d.at && e <= until)
                    })
            });
            if killed {
                k.after_kill += 1;
            } else if paused {
                k.after_stop += 1;
            } else {
                k.violations.push(format!(
                    "key {key}: {} although {} ended by {} ({}) while its process was neither \
                     killed nor stopped past its lease (expiry {expiry:?})",
                    what(next),
                    what(first),
                    end.proc,
                    end.to_state
                ));
            }
        }
    }
    let mut last_completed: HashMap<&str, (i64, i64)> = HashMap::new();
    for c in ev.changes.iter().filter(|c| c.kind() == Kind::Outcome) {
        if c.to_state != "completed" {
            continue;
        }
        let Some((key, s)) = keys.get(&c.item) else {
            continue;
        };
        if let Some((before, item)) = last_completed.get(key.as_str()) {
            if *before > *s {
                k.violations.push(format!(
                    "key {key}: item {} (#{s}) completed after item {item} (#{before})",
                    c.item
                ));
            }
        }
        last_completed.insert(key, (*s, c.item));
    }
    k
}

/// A worker the suite SIGKILLed (database seconds), with the bound within which the slots
/// its process held must come back.
#[derive(Clone, Debug)]
pub(crate) struct Killed {
    pub(crate) proc: String,
    pub(crate) at: f64,
    pub(crate) bound: f64,
}

/// How the queue's slots came back after one kill (see [`fleet_limit`]).
#[derive(Clone, Debug)]
pub(crate) struct SlotsBack {
    pub(crate) proc: String,
    /// Items running under the killed process's claims at the kill, by the audit.
    pub(crate) held: usize,
    /// Seconds from the kill until `max_running` items ran under live processes' claims
    /// again; None if that never happened.
    pub(crate) after: Option<f64>,
    /// Whether items waited (available) throughout the kill's window (until the slots came
    /// back, or the bound if they did not): only then must the slots come back.
    pub(crate) backlog: bool,
}

/// What the fleet-limit checks found (see [`fleet_limit`]).
#[derive(Default, Debug)]
pub(crate) struct FleetLimit {
    /// The most items running at once, by the store's own transitions, and when (database
    /// seconds).
    pub(crate) peak: i64,
    pub(crate) peak_at: Option<f64>,
    /// Seconds during which items waited (available), and of those, seconds with the queue
    /// at its limit.
    pub(crate) backlog_s: f64,
    pub(crate) at_limit_s: f64,
    pub(crate) kills: Vec<SlotsBack>,
    pub(crate) violations: Vec<String>,
}

/// The fleet-wide running limit's checks, from the audit: the store's transitions of the
/// (one) queue's items replayed in the order of their times (`clock_timestamp()` of each row
/// change, on the server's one clock):
///
/// 1. **never more than `limit` running** — the count of items in state `running` (an
///    orphan whose process died stays running until its lease is reclaimed: it holds its
///    slot) is at most `limit` at every instant. The replay can only under-count a
///    transaction still in flight, never over-count a correct store: a claim counts the
///    running items under the queue row's lock after the previous claim committed, and an
///    item that left `running` before that count was audited before it;
/// 2. **the slots come back** — after each kill, the items running under live processes'
///    claims (claimed, or reclaimed, by a process not killed by the time of that kill: a later
///    kill's orphans are the later kill's to bring back) are `limit` again within the kill's
///    bound, as long as items waited (available) all that time;
/// 3. **not vacuous** — the count reached `limit` (the limit bound), and each kill found items
///    running under its process's claims.
///
/// `t0` (database seconds) is the origin of the times quoted in violations.
pub(crate) fn fleet_limit(ev: &Evidence, limit: i64, kills: &[Killed], t0: f64) -> FleetLimit {
    let mut f = FleetLimit::default();
    let mut order: Vec<usize> = (0..ev.changes.len()).collect();
    order.sort_by(|a, b| {
        ev.changes[*a]
            .at
            .total_cmp(&ev.changes[*b].at)
            .then(a.cmp(b))
    });
    let mut kills: Vec<&Killed> = kills.iter().collect();
    kills.sort_by(|a, b| a.at.total_cmp(&b.at));
    let dead_at = |proc: &str, t: f64| kills.iter().any(|k| k.proc == proc && k.at <= t);
    // Item → the process of its current claim, for the items running now.
    let mut holder: HashMap<i64, &str> = HashMap::new();
    let mut available: i64 = 0;
    // Per kill: (the kill, held, when the slots came back, whether a backlog waited
    // throughout its window).
    let mut open: Vec<(&Killed, usize, Option<f64>, bool)> = Vec::new();
    let mut next_kill = 0;
    let mut last_t: Option<f64> = None;
    let mut over = 0usize;
    // Each change in time order, then one step past the last (`None`) that closes the
    // windows. Before a change is applied, the state since the previous one is accounted
    // for: time with a backlog and at the limit, kills that fell in between, and gaps in the
    // backlog within open kills' windows.
    for n in order.into_iter().map(Some).chain(std::iter::once(None)) {
        let t = n.map_or(f64::INFINITY, |n| ev.changes[n].at);
        if let Some(last) = last_t.filter(|_| available > 0 && t.is_finite()) {
            f.backlog_s += t - last;
            if holder.len() as i64 >= limit {
                f.at_limit_s += t - last;
            }
        }
        for (k, _, back, backlog) in &mut open {
            let in_window = last_t.is_some_and(|l| l >= k.at && l < k.at + k.bound);
            if back.is_none() && in_window && available == 0 {
                *backlog = false;
            }
        }
        while next_kill < kills.len() && kills[next_kill].at <= t {
            let k = kills[next_kill];
            next_kill += 1;
            let held = holder.values().filter(|p| **p == k.proc).count();
            let live = holder.values().filter(|p| !dead_at(p, k.at)).count() as i64;
            open.push((k, held, (live >= limit).then_some(k.at), available > 0));
        }
        let Some(n) = n else { break };
        let c = &ev.changes[n];
        let was = c.from_state == "running";
        let is = c.to_state == "running";
        match (was, is) {
            (false, true) => {
                holder.insert(c.item, c.proc.as_str());
            }
            (true, false) => {
                holder.remove(&c.item);
            }
            (true, true) if c.kind() == Kind::Claim => {
                holder.insert(c.item, c.proc.as_str());
            }
            _ => {}
        }
        if c.from_state == "available" && c.to_state != "available" {
            available -= 1;
        }
        if c.to_state == "available" && c.from_state != "available" {
            available += 1;
        }
        let running = holder.len() as i64;
        if running > f.peak {
            f.peak = running;
            f.peak_at = Some(t);
        }
        // Each claim that took the count over the limit (renewals and releases while over it
        // change nothing).
        if running > limit && !was && is {
            over += 1;
            if over <= 5 {
                let mut items: Vec<(&i64, &&str)> = holder.iter().collect();
                items.sort();
                f.violations.push(format!(
                    "{running} items running at {:+.3} s (limit {limit}), once {} claimed item \
                     {} ({} → running): {}",
                    t - t0,
                    c.proc,
                    c.item,
                    c.from_state,
                    items
                        .iter()
                        .map(|(i, p)| format!("{i} by {p}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        for (k, _, back, _) in &mut open {
            // Live as of this kill: a later kill's orphans are that kill's to bring back.
            let live = holder.values().filter(|p| !dead_at(p, k.at)).count() as i64;
            if back.is_none() && t >= k.at && live >= limit {
                *back = Some(t);
            }
        }
        last_t = Some(t);
    }
    if over > 5 {
        f.violations.push(format!(
            "... {over} claims in all took the running count over the limit"
        ));
    }
    if f.peak < limit {
        f.violations.push(format!(
            "vacuous: the running count never reached the limit of {limit} (at most {}): the \
             limit never bound",
            f.peak
        ));
    }
    if kills.is_empty() {
        f.violations
            .push("vacuous: no worker was killed, so no slot had to come back".into());
    }
    for (k, held, back, backlog) in open {
        let after = back.map(|b| b - k.at);
        let late = after.is_none_or(|a| a > k.bound);
        if held == 0 {
            f.violations.push(format!(
                "vacuous: no item ran under {}'s claims when it was killed at {:+.3} s",
                k.proc,
                k.at - t0
            ));
        } else if late && backlog {
            f.violations.push(format!(
                "the {held} slots {} held came back {} after its kill at {:+.3} s, while items \
                 waited (bound {:.1} s)",
                k.proc,
                after.map_or("never".to_owned(), |a| format!("{a:.1} s")),
                k.at - t0,
                k.bound
            ));
        } else if late {
            f.violations.push(format!(
                "vacuous: the backlog ran out within {:.1} s of {}'s kill at {:+.3} s, before \
                 its slots came back, so their return was not tested",
                k.bound,
                k.proc,
                k.at - t0
            ));
        }
        f.kills.push(SlotsBack {
            proc: k.proc.clone(),
            held,
            after,
            backlog,
        });
    }
    f
}

/// Per-kind counts for the notes.
pub(crate) fn kinds(ev: &Evidence) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in &ev.items {
        *m.entry(i.kind.clone()).or_default() += 1;
    }
    m
}

/// One eviction, from the audit of the store: the tombstone `cleanup_stale_instances` wrote,
/// and what the deleted instance row said.
#[derive(Clone, Debug)]
pub(crate) struct Eviction {
    pub(crate) instance: Uuid,
    /// The instance's own process (its row's `host`); `?` when no row was audited.
    pub(crate) owner: String,
    /// The process whose sweep reaped it.
    pub(crate) reaper: String,
    /// Database seconds.
    pub(crate) at: f64,
    pub(crate) heartbeat_age: Option<f64>,
    pub(crate) alive_lock: Option<bool>,
    pub(crate) lock_lost_for: Option<f64>,
    pub(crate) lock_held: Option<bool>,
    pub(crate) since_server_start: f64,
}

impl Eviction {
    /// What the store knew when it reaped it.
    pub(crate) fn evidence(&self) -> String {
        let secs = |s: Option<f64>| s.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "?".into());
        format!(
            "heartbeat {} old, {}, lock {} at the deletion{}, server (re)started {:.1} s before",
            secs(self.heartbeat_age),
            match self.alive_lock {
                Some(true) => "lock-proven",
                Some(false) => "not lock-proven",
                None => "lock state unknown",
            },
            match self.lock_held {
                Some(true) => "held",
                Some(false) => "not held",
                None => "?",
            },
            self.lock_lost_for
                .map(|s| format!(" (a sweep first saw it missing {s:.1} s before)"))
                .unwrap_or_default(),
            self.since_server_start
        )
    }
}

/// The evictions in the instance audit, oldest first.
pub(crate) fn evictions(ev: &Evidence) -> Vec<Eviction> {
    ev.instance_events
        .iter()
        .filter(|e| e.op == "tombstone")
        .map(|t| {
            let deleted = ev
                .instance_events
                .iter()
                .rev()
                .find(|e| e.op == "delete" && e.instance == t.instance);
            let owner = deleted
                .or_else(|| {
                    ev.instance_events
                        .iter()
                        .find(|e| e.op == "register" && e.instance == t.instance)
                })
                .and_then(|e| e.host.clone())
                .unwrap_or_else(|| "?".into());
            Eviction {
                instance: t.instance,
                owner,
                reaper: t.proc.clone(),
                at: t.at,
                heartbeat_age: deleted.and_then(|d| d.heartbeat_age),
                alive_lock: deleted.and_then(|d| d.alive_lock),
                lock_lost_for: deleted.and_then(|d| d.lock_lost_for),
                lock_held: deleted.and_then(|d| d.lock_held),
                since_server_start: deleted.map_or(t.since_server_start, |d| d.since_server_start),
            }
        })
        .collect()
}

/// A worker process's life as the suite saw it, on the database clock.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lifeline {
    pub(crate) name: String,
    /// When it was killed or exited.
    pub(crate) exited: Option<f64>,
    /// Its freezes (SIGSTOP, proxy freeze): from, until (None: never thawed).
    pub(crate) frozen: Vec<(f64, Option<f64>)>,
}

/// What an evicted instance's process was doing when it was reaped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum OwnerWas {
    /// Dead: killed or exited before the eviction.
    Gone,
    /// Frozen (or just thawed, within `thaw_window`) for this many seconds.
    Frozen(f64),
    /// Running and reachable: a live instance.
    Live,
    /// No process of the suite.
    Unknown,
}

/// What `e`'s process was doing at the eviction. An eviction within `thaw_window` after a
/// freeze ended counts as the freeze's (its stale state reaches the store at the thaw).
pub(crate) fn owner_was(e: &Eviction, lives: &[Lifeline], thaw_window: f64) -> OwnerWas {
    let Some(life) = lives.iter().find(|l| l.name == e.owner) else {
        return OwnerWas::Unknown;
    };
    if life.exited.is_some_and(|x| x <= e.at) {
        return OwnerWas::Gone;
    }
    for &(from, until) in &life.frozen {
        if from <= e.at && until.is_none_or(|u| e.at <= u + thaw_window) {
            return OwnerWas::Frozen(until.map_or(e.at, |u| u.min(e.at)) - from);
        }
    }
    OwnerWas::Live
}

/// Judges every eviction: the violations (a live instance evicted; an instance reaped by
/// its own process's sweep; one frozen for no longer than `stale_after` that was reaped;
/// one of no known process) and a note per eviction. `marks` are the scenario's faults
/// (database seconds, label), to say which one an eviction followed.
pub(crate) fn judge_evictions(
    evictions: &[Eviction],
    lives: &[Lifeline],
    stale_after: f64,
    thaw_window: f64,
    marks: &[(f64, String)],
    t0: f64,
) -> (Vec<String>, Vec<String>) {
    let (mut violations, mut notes) = (Vec::new(), Vec::new());
    for e in evictions {
        let after = marks
            .iter()
            .rev()
            .find(|(at, _)| *at <= e.at)
            .map(|(at, label)| format!(", {:.1} s after {label}", e.at - at))
            .unwrap_or_default();
        let what = format!(
            "{}'s instance {} evicted at {:+.1}s by {}{after} ({})",
            e.owner,
            &e.instance.to_string()[..8],
            e.at - t0,
            e.reaper,
            e.evidence()
        );
        let was = owner_was(e, lives, thaw_window);
        let mut wrong = Vec::new();
        if e.reaper == e.owner {
            wrong.push("its own sweep reaped it (a sweep must never reap its caller)".to_owned());
        }
        match was {
            OwnerWas::Live => wrong.push("its process was alive and reachable".to_owned()),
            OwnerWas::Frozen(secs) if secs <= stale_after => wrong.push(format!(
                "its process had been frozen for only {secs:.1} s, not longer than stale_after \
                 ({stale_after:.0} s)"
            )),
            OwnerWas::Unknown => wrong.push("no process of the suite registered it".to_owned()),
            OwnerWas::Gone | OwnerWas::Frozen(_) => {}
        }
        if wrong.is_empty() {
            notes.push(format!(
                "{what}: its process was {}",
                match was {
                    OwnerWas::Gone => "dead".to_owned(),
                    OwnerWas::Frozen(secs) => format!("frozen for {secs:.1} s"),
                    _ => "?".to_owned(),
                }
            ));
        } else {
            violations.push(format!("{what}: {}", wrong.join("; ")));
        }
    }
    (violations, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "chaos-w1";
    const B: &str = "chaos-w2";

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn item(id: i64, kind: &str, state: &str, attempt: i32, token: i64, errors: usize) -> Item {
        Item {
            id,
            kind: kind.into(),
            state: state.into(),
            attempt,
            token: Some(token),
            errors: (0..errors)
                .map(|a| serde_json::json!({ "attempt": a + 1, "kind": "failed" }))
                .collect(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn change(
        item: i64,
        states: (&str, &str),
        owners: (Option<Uuid>, Option<Uuid>),
        tokens: (Option<i64>, Option<i64>),
        attempts: (i32, i32),
        error: Option<Value>,
        proc: &str,
        at: f64,
    ) -> Change {
        // A running item's lease: 3 s from its claim (the short profile's).
        let lease =
            |running: bool, owner: Option<Uuid>| (running && owner.is_some()).then_some(at + 3.0);
        Change {
            op: "update".into(),
            item,
            from_state: states.0.into(),
            to_state: states.1.into(),
            from_instance: owners.0,
            to_instance: owners.1,
            from_token: tokens.0,
            to_token: tokens.1,
            from_attempt: attempts.0,
            to_attempt: attempts.1,
            from_expiry: lease(states.0 == "running", owners.0).map(|e| e - 1.0),
            to_expiry: lease(states.1 == "running", owners.1),
            from_renewals: 0,
            to_renewals: 0,
            checkpointed: false,
            from_cancel: false,
            to_cancel: false,
            error,
            proc: proc.into(),
            at,
            txn_at: at,
        }
    }

    /// A renewal of `token`'s lease by `who` at `at`: expiry `at + 1` → `at + 3`.
    fn renew(item: i64, token: i64, attempt: i32, who: (Uuid, &str), at: f64) -> Change {
        Change {
            from_expiry: Some(at + 1.0),
            to_expiry: Some(at + 3.0),
            from_renewals: 0,
            to_renewals: 1,
            ..change(
                item,
                ("running", "running"),
                (Some(who.0), Some(who.0)),
                (Some(token), Some(token)),
                (attempt, attempt),
                None,
                who.1,
                at,
            )
        }
    }

    fn claim(item: i64, token: i64, attempt: i32, who: (Uuid, &str), at: f64) -> Change {
        change(
            item,
            ("available", "running"),
            (None, Some(who.0)),
            (None, Some(token)),
            (attempt - 1, attempt),
            None,
            who.1,
            at,
        )
    }

    fn complete(item: i64, token: i64, attempt: i32, who: (Uuid, &str), at: f64) -> Change {
        change(
            item,
            ("running", "completed"),
            (Some(who.0), None),
            (Some(token), Some(token)),
            (attempt, attempt),
            None,
            who.1,
            at,
        )
    }

    fn exec(item: i64, attempt: i32, token: i64, who: (Uuid, &str)) -> Exec {
        Exec {
            item,
            attempt,
            token,
            instance: who.0,
            proc: who.1.into(),
        }
    }

    /// The evidence of `items`, each enqueued by the suite (its insert audited first).
    fn evidence(items: Vec<Item>, changes: Vec<Change>, execs: Vec<Exec>) -> Evidence {
        let mut all: Vec<Change> = items
            .iter()
            .map(|i| Change {
                op: "insert".into(),
                from_state: "-".into(),
                to_state: "scheduled".into(),
                from_expiry: None,
                to_expiry: None,
                ..change(
                    i.id,
                    ("-", "-"),
                    (None, None),
                    (None, None),
                    (0, 0),
                    None,
                    SUITE_APP,
                    0.0,
                )
            })
            .collect();
        all.extend(changes);
        Evidence {
            enqueued: items.iter().map(|i| i.id).collect(),
            items,
            changes: all,
            execs,
            effects: HashMap::new(),
            cancels: HashMap::new(),
            evicted: HashMap::new(),
            instance_events: Vec::new(),
        }
    }

    /// A lease held at the fault ran again when its completion, written by the killed
    /// process just before the kill (stamped before the fault) but committed after the suite
    /// read the leases it held, ends it; a lease nothing ended after its start is stuck.
    #[test]
    fn a_lease_ended_by_a_write_stamped_before_the_fault_ran_again() {
        let claim = change(
            1,
            ("available", "running"),
            (None, Some(id(1))),
            (None, Some(10)),
            (0, 1),
            None,
            B,
            1.0,
        );
        let completion = change(
            1,
            ("running", "completed"),
            (Some(id(1)), None),
            (Some(10), Some(10)),
            (1, 1),
            None,
            B,
            4.9,
        );
        let ev = evidence(
            vec![item(1, "noop", "completed", 1, 10, 0)],
            vec![claim.clone(), completion],
            Vec::new(),
        );
        let r = rerun(&ev, 5.0, &[(1, 10)], &[B]);
        assert_eq!((r.stuck.len(), r.own_outcomes), (0, 1));
        assert_eq!(r.all_after, Some(0.0));

        let held = evidence(
            vec![item(1, "noop", "running", 1, 10, 0)],
            vec![claim],
            Vec::new(),
        );
        assert_eq!(rerun(&held, 5.0, &[(1, 10)], &[B]).stuck, vec![(1, 10)]);
    }

    /// Nothing found, in any list.
    fn clean(v: &Verdict) -> bool {
        v.lost.is_empty()
            && v.double.is_empty()
            && v.effects.is_empty()
            && v.history.is_empty()
            && v.fence.is_empty()
    }

    #[test]
    fn a_claim_that_completed_once_passes_every_check() {
        let a = (id(1), A);
        let ev = evidence(
            vec![item(1, "noop", "completed", 1, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0), complete(1, 10, 1, a, 2.0)],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert_eq!(
            (
                v.lost.len(),
                v.double.len(),
                v.effects.len(),
                v.history.len()
            ),
            (0, 0, 0, 0),
            "{:?} {:?} {:?} {:?}",
            v.lost,
            v.double,
            v.effects,
            v.history
        );
        assert_eq!(v.completed, 1);
    }

    #[test]
    fn a_zombies_completion_on_a_reclaimed_item_is_a_double_outcome() {
        let (a, b) = ((id(1), A), (id(2), B));
        let expired = serde_json::json!({ "attempt": 1, "kind": "lease_expired", "error": "lease expired: the owning instance stopped renewing" });
        let reclaim = change(
            1,
            ("running", "running"),
            (Some(a.0), Some(b.0)),
            (Some(10), Some(11)),
            (1, 2),
            Some(expired.clone()),
            B,
            3.0,
        );
        // The zombie (A) writes the completion while the row holds B's claim.
        let ev = evidence(
            vec![Item {
                errors: vec![expired],
                ..item(1, "noop", "completed", 2, 11, 0)
            }],
            vec![
                claim(1, 10, 1, a, 1.0),
                reclaim,
                complete(1, 11, 2, (b.0, A), 4.0),
            ],
            vec![exec(1, 1, 10, a), exec(1, 2, 11, b)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.double.iter().any(|d| d.contains("written by chaos-w1")),
            "{:?}",
            v.double
        );
    }

    /// A lease that lapsed under a live owner: the sweep releases it with the attempt's entry,
    /// and the reclaim after it writes none; or, with no attempts left, the store's end
    /// writes its own entry beside the release's.
    #[test]
    fn a_lapsed_lease_released_with_its_entry_then_reclaimed_or_ended_passes() {
        let (a, b) = ((id(1), A), (id(2), B));
        let lapsed = serde_json::json!({ "attempt": 1, "kind": "lease_expired", "error": "lease expired: the owning instance stopped renewing" });
        let release = |item: i64| {
            change(
                item,
                ("running", "running"),
                (Some(a.0), None),
                (Some(10), Some(10)),
                (1, 1),
                Some(lapsed.clone()),
                B,
                5.0,
            )
        };
        let reclaim = change(
            1,
            ("running", "running"),
            (None, Some(b.0)),
            (Some(10), Some(11)),
            (1, 2),
            None,
            B,
            5.1,
        );
        let no_attempts = serde_json::json!({ "attempt": 1, "kind": "lease_expired", "error": "lease expired on attempt 1 of 1; no attempts left" });
        let end = change(
            2,
            ("running", "dead"),
            (None, None),
            (Some(10), Some(10)),
            (1, 1),
            Some(no_attempts.clone()),
            B,
            5.1,
        );
        let ev = evidence(
            vec![
                Item {
                    errors: vec![lapsed.clone()],
                    ..item(1, "noop", "completed", 2, 11, 0)
                },
                Item {
                    errors: vec![lapsed.clone(), no_attempts],
                    ..item(2, "noop", "dead", 1, 10, 0)
                },
            ],
            vec![
                claim(1, 10, 1, a, 1.0),
                release(1),
                reclaim,
                complete(1, 11, 2, b, 6.0),
                claim(2, 10, 1, a, 1.0),
                release(2),
                end,
            ],
            vec![exec(1, 1, 10, a), exec(1, 2, 11, b), exec(2, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.history.iter().all(|h| !h.contains("item 1:")),
            "{:?}",
            v.history
        );
        assert!(
            v.history
                .iter()
                .all(|h| !h.contains("do not match") && !h.contains("without a history entry")),
            "{:?}",
            v.history
        );
        assert_eq!((v.reclaims, v.lapsed), (1, 2));
    }

    #[test]
    fn two_outcomes_for_one_claim_are_a_double_outcome() {
        let a = (id(1), A);
        let failed = serde_json::json!({ "attempt": 1, "kind": "failed" });
        let fail = change(
            1,
            ("running", "available"),
            (Some(a.0), None),
            (Some(10), Some(10)),
            (1, 1),
            Some(failed.clone()),
            A,
            2.0,
        );
        // The same claim's completion lands as well (a broken fence would allow it).
        let mut again = complete(1, 10, 1, a, 3.0);
        again.from_state = "running".into();
        let ev = evidence(
            vec![Item {
                errors: vec![failed],
                ..item(1, "fail", "completed", 1, 10, 0)
            }],
            vec![claim(1, 10, 1, a, 1.0), fail, again],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.double.iter().any(|d| d.contains("recorded 2 outcomes")),
            "{:?}",
            v.double
        );
        assert!(
            !v.history.is_empty(),
            "attempt 1 ended twice: {:?}",
            v.history
        );
    }

    #[test]
    fn a_completion_without_an_execution_in_the_ledger_is_a_double_outcome() {
        let a = (id(1), A);
        let ev = evidence(
            vec![item(1, "noop", "completed", 1, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0), complete(1, 10, 1, a, 2.0)],
            vec![],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.double.iter().any(|d| d.contains("no execution")),
            "{:?}",
            v.double
        );
    }

    #[test]
    fn a_transactional_item_with_two_effects_or_a_foreign_token_is_an_effects_mismatch() {
        let a = (id(1), A);
        let mut ev = evidence(
            vec![
                item(1, "tx", "completed", 1, 10, 0),
                item(2, "tx", "completed", 1, 20, 0),
                item(3, "tx", "completed", 1, 30, 0),
            ],
            vec![
                claim(1, 10, 1, a, 1.0),
                complete(1, 10, 1, a, 2.0),
                claim(2, 20, 1, a, 1.0),
                complete(2, 20, 1, a, 2.0),
                claim(3, 30, 1, a, 1.0),
                complete(3, 30, 1, a, 2.0),
            ],
            vec![exec(1, 1, 10, a), exec(2, 1, 20, a), exec(3, 1, 30, a)],
        );
        ev.effects
            .insert(1, vec![(Some(10), A.into()), (Some(10), A.into())]);
        ev.effects.insert(2, vec![(Some(19), A.into())]);
        // Item 3 completed without its effect.
        let v = check(&ev, 0.0);
        assert_eq!(v.effects.len(), 3, "{:?}", v.effects);
    }

    #[test]
    fn an_item_cancelled_without_a_request_or_left_unfinished_is_lost() {
        let a = (id(1), A);
        let cancelled = serde_json::json!({ "attempt": 1, "kind": "cancelled", "error": "the lease fence fired" });
        let ev = evidence(
            vec![
                Item {
                    errors: vec![cancelled.clone()],
                    ..item(1, "sleep", "cancelled", 1, 10, 0)
                },
                item(2, "noop", "running", 1, 20, 0),
            ],
            vec![
                claim(1, 10, 1, a, 1.0),
                change(
                    1,
                    ("running", "cancelled"),
                    (Some(a.0), None),
                    (Some(10), Some(10)),
                    (1, 1),
                    Some(cancelled),
                    A,
                    2.0,
                ),
                claim(2, 20, 1, a, 1.0),
            ],
            vec![exec(1, 1, 10, a), exec(2, 1, 20, a)],
        );
        let v = check(&ev, 0.0);
        assert_eq!(v.lost.len(), 2, "{:?}", v.lost);
    }

    #[test]
    fn an_attempt_count_that_does_not_match_the_claims_is_a_history_mismatch() {
        let a = (id(1), A);
        let ev = evidence(
            vec![item(1, "noop", "completed", 2, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0), complete(1, 10, 1, a, 2.0)],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.history.iter().any(|h| h.contains("attempt is 2")),
            "{:?}",
            v.history
        );
    }

    #[test]
    fn a_drained_release_gives_its_attempt_back_without_a_mismatch() {
        let (a, b) = ((id(1), A), (id(2), B));
        let release = change(
            1,
            ("running", "available"),
            (Some(a.0), None),
            (Some(10), Some(10)),
            (1, 0),
            None,
            A,
            2.0,
        );
        let ev = evidence(
            vec![item(1, "noop", "completed", 1, 11, 0)],
            vec![
                claim(1, 10, 1, a, 1.0),
                release,
                claim(1, 11, 1, b, 3.0),
                complete(1, 11, 1, b, 4.0),
            ],
            vec![exec(1, 1, 10, a), exec(1, 1, 11, b)],
        );
        let v = check(&ev, 0.0);
        assert!(v.history.is_empty(), "{:?}", v.history);
        assert!(v.double.is_empty(), "{:?}", v.double);
        assert_eq!(v.redelivered, 1);
    }

    #[test]
    fn renewals_by_the_owner_under_its_token_pass_every_check() {
        let a = (id(1), A);
        let ev = evidence(
            vec![item(1, "sleep", "completed", 1, 10, 0)],
            vec![
                claim(1, 10, 1, a, 1.0),
                renew(1, 10, 1, a, 2.0),
                renew(1, 10, 1, a, 3.0),
                complete(1, 10, 1, a, 4.0),
            ],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(clean(&v), "{:?} {:?} {:?}", v.lost, v.history, v.fence);
    }

    #[test]
    fn an_item_deleted_from_the_store_is_lost() {
        let a = (id(1), A);
        let mut ev = evidence(
            vec![item(1, "noop", "completed", 1, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0)],
            vec![exec(1, 1, 10, a)],
        );
        // Item 1 is deleted by a bug and never seen again.
        ev.changes.push(Change {
            op: "delete".into(),
            to_state: "-".into(),
            ..change(
                1,
                ("running", "-"),
                (Some(a.0), None),
                (Some(10), None),
                (1, 0),
                None,
                A,
                2.0,
            )
        });
        ev.items.clear();
        let v = check(&ev, 0.0);
        assert!(
            v.lost
                .iter()
                .any(|l| l.contains("gone at the end") && l.contains("deleted by chaos-w1")),
            "{:?}",
            v.lost
        );
    }

    #[test]
    fn an_item_the_suite_did_not_enqueue_is_a_history_mismatch() {
        let a = (id(1), A);
        let mut ev = evidence(
            vec![item(1, "noop", "completed", 1, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0), complete(1, 10, 1, a, 2.0)],
            vec![exec(1, 1, 10, a)],
        );
        ev.enqueued.clear();
        ev.enqueued.push(2);
        ev.changes[0].proc = A.into();
        let v = check(&ev, 0.0);
        assert!(
            v.history.iter().any(|h| h.contains("never enqueued")),
            "{:?}",
            v.history
        );
        assert!(
            v.history.iter().any(|h| h.contains("inserted by chaos-w1")),
            "{:?}",
            v.history
        );
        assert!(
            v.lost.iter().any(|l| l.starts_with("item 2: enqueued")),
            "{:?}",
            v.lost
        );
    }

    #[test]
    fn a_renewal_by_a_process_that_does_not_hold_the_lease_is_a_fence_violation() {
        let a = (id(1), A);
        let ev = evidence(
            vec![item(1, "sleep", "completed", 1, 10, 0)],
            vec![
                claim(1, 10, 1, a, 1.0),
                // B's session extends A's lease (an owner check missing).
                renew(1, 10, 1, (a.0, B), 2.0),
                complete(1, 10, 1, a, 3.0),
            ],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.fence
                .iter()
                .any(|f| f.contains("renewal") && f.contains("written by chaos-w2")),
            "{:?}",
            v.fence
        );
    }

    #[test]
    fn a_renewal_of_an_expired_lease_is_a_fence_violation() {
        let a = (id(1), A);
        let mut late = renew(1, 10, 1, a, 5.0);
        late.from_expiry = Some(4.0);
        let ev = evidence(
            vec![item(1, "sleep", "completed", 1, 10, 0)],
            vec![claim(1, 10, 1, a, 1.0), late, complete(1, 10, 1, a, 6.0)],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.fence.iter().any(|f| f.contains("had expired")),
            "{:?}",
            v.fence
        );
    }

    #[test]
    fn a_checkpoint_under_a_former_claim_is_a_fence_violation() {
        let (a, b) = ((id(1), A), (id(2), B));
        let expired =
            serde_json::json!({ "attempt": 1, "kind": "lease_expired", "error": "lease expired" });
        let reclaim = change(
            1,
            ("running", "running"),
            (Some(a.0), Some(b.0)),
            (Some(10), Some(11)),
            (1, 2),
            Some(expired.clone()),
            B,
            3.0,
        );
        // After B's reclaim, the zombie A's checkpoint lands on B's claim (a fence that
        // checked only the item).
        let zombie = Change {
            checkpointed: true,
            from_expiry: Some(6.0),
            to_expiry: Some(6.0),
            ..change(
                1,
                ("running", "running"),
                (Some(b.0), Some(b.0)),
                (Some(11), Some(11)),
                (2, 2),
                None,
                A,
                4.0,
            )
        };
        let ev = evidence(
            vec![Item {
                errors: vec![expired],
                ..item(1, "checkpoint", "completed", 2, 11, 0)
            }],
            vec![
                claim(1, 10, 1, a, 1.0),
                reclaim,
                zombie,
                complete(1, 11, 2, b, 5.0),
            ],
            vec![exec(1, 1, 10, a), exec(1, 2, 11, b)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.fence
                .iter()
                .any(|f| f.contains("checkpoint") && f.contains("written by chaos-w1")),
            "{:?}",
            v.fence
        );
    }

    fn cancel_request(item: i64, token: i64, attempt: i32, owner: Uuid, at: f64) -> Change {
        Change {
            from_expiry: Some(at + 1.0),
            to_expiry: Some(at + 1.0),
            from_cancel: false,
            to_cancel: true,
            ..change(
                item,
                ("running", "running"),
                (Some(owner), Some(owner)),
                (Some(token), Some(token)),
                (attempt, attempt),
                None,
                SUITE_APP,
                at,
            )
        }
    }

    #[test]
    fn a_cancel_request_the_suite_did_not_make_is_a_fence_violation() {
        let a = (id(1), A);
        let cancelled = serde_json::json!({ "attempt": 1, "kind": "cancelled" });
        let end = change(
            1,
            ("running", "cancelled"),
            (Some(a.0), None),
            (Some(10), Some(10)),
            (1, 1),
            Some(cancelled.clone()),
            A,
            3.0,
        );
        let ev = evidence(
            vec![Item {
                errors: vec![cancelled],
                ..item(1, "sleep", "cancelled", 1, 10, 0)
            }],
            vec![
                claim(1, 10, 1, a, 1.0),
                cancel_request(1, 10, 1, a.0, 2.0),
                end,
            ],
            vec![exec(1, 1, 10, a)],
        );
        let v = check(&ev, 0.0);
        assert!(
            v.fence.iter().any(|f| f.contains("a cancel request")),
            "{:?}",
            v.fence
        );
        // Asked for, the same history is clean.
        let mut asked = ev;
        asked.cancels.insert(1, "requested".into());
        let v = check(&asked, 0.0);
        assert!(clean(&v), "{:?} {:?} {:?}", v.lost, v.history, v.fence);
    }

    #[test]
    fn a_claim_after_a_cancel_request_is_a_lost_cancel() {
        let (a, b) = ((id(1), A), (id(2), B));
        let failed = serde_json::json!({ "attempt": 1, "kind": "failed" });
        // The claim the cancel reached fails and is retried; the retry runs and completes.
        let retry = change(
            1,
            ("running", "available"),
            (Some(a.0), None),
            (Some(10), Some(10)),
            (1, 1),
            Some(failed.clone()),
            A,
            3.0,
        );
        let mut again = claim(1, 11, 2, b, 4.0);
        again.from_token = Some(10);
        let mut ev = evidence(
            vec![Item {
                errors: vec![failed],
                ..item(1, "fail", "completed", 2, 11, 0)
            }],
            vec![
                claim(1, 10, 1, a, 1.0),
                cancel_request(1, 10, 1, a.0, 2.0),
                retry,
                again,
                complete(1, 11, 2, b, 5.0),
            ],
            vec![exec(1, 1, 10, a), exec(1, 2, 11, b)],
        );
        ev.cancels.insert(1, "requested".into());
        let v = check(&ev, 0.0);
        assert!(
            v.lost.iter().any(|l| l.contains("the cancel was lost")),
            "{:?}",
            v.lost
        );
    }

    fn eviction(owner: &str, reaper: &str, at: f64) -> Eviction {
        Eviction {
            instance: id(7),
            owner: owner.into(),
            reaper: reaper.into(),
            at,
            heartbeat_age: Some(31.0),
            alive_lock: Some(true),
            lock_lost_for: None,
            lock_held: Some(false),
            since_server_start: 30.5,
        }
    }

    fn life(name: &str, exited: Option<f64>, frozen: Vec<(f64, Option<f64>)>) -> Lifeline {
        Lifeline {
            name: name.into(),
            exited,
            frozen,
        }
    }

    #[test]
    fn an_evicted_live_instance_is_a_violation_and_a_dead_ones_eviction_is_not() {
        let lives = [life(A, None, vec![]), life(B, Some(10.0), vec![])];
        let marks = [(5.0, "fast restart".to_owned())];
        let (violations, notes) = judge_evictions(
            &[eviction(A, B, 20.0), eviction(B, A, 14.0)],
            &lives,
            30.0,
            7.0,
            &marks,
            0.0,
        );
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].contains("alive and reachable")
                && violations[0].contains("15.0 s after fast restart"),
            "{violations:?}"
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("was dead"), "{notes:?}");
    }

    #[test]
    fn an_instance_reaped_by_its_own_sweep_is_a_violation() {
        // Frozen past stale_after, which alone would be allowed — but it reaped itself.
        let lives = [life(A, None, vec![(1.0, Some(40.0))])];
        let (violations, _) = judge_evictions(&[eviction(A, A, 41.0)], &lives, 30.0, 7.0, &[], 0.0);
        assert!(
            violations.len() == 1 && violations[0].contains("its own sweep"),
            "{violations:?}"
        );
    }

    #[test]
    fn an_instance_frozen_no_longer_than_stale_after_must_not_be_evicted() {
        let lives = [life(A, None, vec![(1.0, Some(9.0)), (20.0, None)])];
        // Reaped 2 s after an 8 s freeze ended (stale_after 30 s): too early.
        let (violations, _) = judge_evictions(&[eviction(A, B, 11.0)], &lives, 30.0, 7.0, &[], 0.0);
        assert!(
            violations.len() == 1 && violations[0].contains("frozen for only 8.0 s"),
            "{violations:?}"
        );
        // Reaped 35 s into a freeze that lasts: allowed.
        let (violations, notes) =
            judge_evictions(&[eviction(A, B, 55.0)], &lives, 30.0, 7.0, &[], 0.0);
        assert!(violations.is_empty(), "{violations:?}");
        assert!(notes[0].contains("frozen for 35.0 s"), "{notes:?}");
    }

    #[test]
    fn an_evicted_instance_of_no_known_process_is_a_violation() {
        let (violations, _) = judge_evictions(
            &[eviction("?", B, 5.0)],
            &[life(B, None, vec![])],
            30.0,
            7.0,
            &[],
            0.0,
        );
        assert!(
            violations.len() == 1 && violations[0].contains("no process of the suite"),
            "{violations:?}"
        );
    }

    #[test]
    fn evictions_are_read_from_the_tombstones_and_the_deleted_rows() {
        let event = |op: &str, host: Option<&str>, proc: &str, at: f64| InstanceEvent {
            op: op.into(),
            instance: id(7),
            host: host.map(Into::into),
            proc: proc.into(),
            at,
            heartbeat_age: (op == "delete").then_some(35.0),
            alive_lock: (op != "tombstone").then_some(true),
            lock_lost_for: None,
            lock_held: (op == "delete").then_some(false),
            since_server_start: 40.0,
        };
        let mut ev = evidence(vec![], vec![], vec![]);
        ev.instance_events = vec![
            event("register", Some(A), A, 1.0),
            event("delete", Some(A), B, 36.0),
            event("tombstone", None, B, 36.0),
        ];
        let found = evictions(&ev);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].owner.as_str(), found[0].reaper.as_str()), (A, B));
        assert_eq!(found[0].heartbeat_age, Some(35.0));
        assert!(found[0]
            .evidence()
            .contains("heartbeat 35.0 s old, lock-proven, lock not held"));
    }

    /// Items 1 and 2 of key `k` (places 0 and 1), and item 3 of key `j`.
    fn two_keys() -> HashMap<i64, (String, i64)> {
        HashMap::from([
            (1, ("k".into(), 0)),
            (2, ("k".into(), 1)),
            (3, ("j".into(), 0)),
        ])
    }

    /// A sweeper `who` frees the lease of `token` (its owner is dead).
    fn release(item: i64, token: i64, attempt: i32, owner: Uuid, who: &str, at: f64) -> Change {
        change(
            item,
            ("running", "running"),
            (Some(owner), None),
            (Some(token), Some(token)),
            (attempt, attempt),
            None,
            who,
            at,
        )
    }

    /// `who` claims the orphan of `token` anew as `new`.
    fn reclaim(
        item: i64,
        token: i64,
        new: i64,
        attempt: i32,
        who: (Uuid, &str),
        at: f64,
    ) -> Change {
        change(
            item,
            ("running", "running"),
            (None, Some(who.0)),
            (Some(token), Some(new)),
            (attempt, attempt + 1),
            Some(serde_json::json!({ "attempt": attempt, "kind": "lease_expired" })),
            who.1,
            at,
        )
    }

    /// A scheduled item due: available from `at`.
    fn due(item: i64, at: f64) -> Change {
        change(
            item,
            ("scheduled", "available"),
            (None, None),
            (None, None),
            (0, 0),
            None,
            A,
            at,
        )
    }

    /// Six items due at once under a limit of 2: A and B each run one, B is killed at 3.0
    /// holding item 2, and C reclaims it at 5.0 (and later claims the rest), 2 at a time.
    fn limited_run() -> Evidence {
        let (a, b, c) = ((id(1), A), (id(2), B), (id(3), "chaos-w3"));
        let mut changes: Vec<Change> = (1..=6).map(|i| due(i, 0.1)).collect();
        changes.extend([
            claim(1, 10, 1, a, 1.0),
            claim(2, 20, 1, b, 1.1),
            complete(1, 10, 1, a, 2.0),
            claim(3, 30, 1, a, 2.1),
            reclaim(2, 20, 21, 1, c, 5.0),
            complete(3, 30, 1, a, 6.0),
            claim(4, 40, 1, c, 6.1),
            complete(2, 21, 2, c, 7.0),
            claim(5, 50, 1, a, 7.1),
            complete(4, 40, 1, c, 8.0),
            claim(6, 60, 1, c, 8.1),
            complete(5, 50, 1, a, 9.0),
            complete(6, 60, 1, c, 9.1),
        ]);
        evidence(Vec::new(), changes, Vec::new())
    }

    fn b_killed_at(at: f64) -> Vec<Killed> {
        vec![Killed {
            proc: B.into(),
            at,
            bound: 8.0,
        }]
    }

    #[test]
    fn a_run_held_at_its_limit_whose_killed_slots_come_back_passes() {
        let f = fleet_limit(&limited_run(), 2, &b_killed_at(3.0), 0.0);
        assert!(f.violations.is_empty(), "{:#?}", f.violations);
        assert_eq!((f.peak, f.peak_at), (2, Some(1.1)));
        assert_eq!(f.kills.len(), 1);
        let k = &f.kills[0];
        assert_eq!((k.held, k.backlog), (1, true));
        // Back when C reclaimed item 2 (A ran item 3 meanwhile).
        assert_eq!(k.after, Some(2.0));
        assert!(f.at_limit_s > 0.0 && f.at_limit_s <= f.backlog_s);
    }

    #[test]
    fn more_running_than_the_limit_is_a_violation_even_counting_an_orphan() {
        // With a limit of 1 the orphan of the killed B and A's item are two running at once.
        let f = fleet_limit(&limited_run(), 1, &b_killed_at(3.0), 0.0);
        assert!(
            f.violations[0].starts_with("2 items running at +1.100 s (limit 1)"),
            "{:#?}",
            f.violations
        );
        assert_eq!(f.peak, 2);
    }

    #[test]
    fn a_limit_never_reached_or_no_kill_is_vacuous() {
        let f = fleet_limit(&limited_run(), 3, &b_killed_at(3.0), 0.0);
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("vacuous: the running count never reached")),
            "{:#?}",
            f.violations
        );
        let f = fleet_limit(&limited_run(), 2, &[], 0.0);
        assert_eq!(
            f.violations,
            ["vacuous: no worker was killed, so no slot had to come back"]
        );
        // Killed before it claimed anything: it held nothing.
        let f = fleet_limit(&limited_run(), 2, &b_killed_at(0.5), 0.0);
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("vacuous: no item ran under chaos-w2")),
            "{:#?}",
            f.violations
        );
    }

    #[test]
    fn a_later_kills_late_orphan_is_that_kills_not_the_earlier_ones() {
        // Limit 2: B is killed at 3.0 holding item 2, A at 4.0 holding item 1. C reclaims
        // B's orphan at 5.0 (A's still counted live for B's kill), A's only at 12.5.
        let c = (id(3), "chaos-w3");
        let mut changes: Vec<Change> = (1..=5).map(|i| due(i, 0.1)).collect();
        changes.extend([
            claim(1, 10, 1, (id(1), A), 1.0),
            claim(2, 20, 1, (id(2), B), 1.1),
            reclaim(2, 20, 21, 1, c, 5.0),
            complete(2, 21, 2, c, 6.0),
            claim(3, 30, 1, c, 6.1),
            reclaim(1, 10, 11, 1, c, 12.5),
            complete(3, 30, 1, c, 13.0),
            complete(1, 11, 2, c, 13.1),
            claim(4, 40, 1, c, 13.2),
            claim(5, 50, 1, c, 13.3),
            complete(4, 40, 1, c, 14.0),
            complete(5, 50, 1, c, 14.1),
        ]);
        let ev = evidence(Vec::new(), changes, Vec::new());
        let kill = |proc: &str, at: f64| Killed {
            proc: proc.into(),
            at,
            bound: 8.0,
        };
        let f = fleet_limit(&ev, 2, &[kill(B, 3.0), kill(A, 4.0)], 0.0);
        assert_eq!(
            (f.kills[0].after, f.kills[1].after),
            (Some(2.0), Some(8.5)),
            "{:#?}",
            f.kills
        );
        assert_eq!(f.violations.len(), 1, "{:#?}", f.violations);
        assert!(
            f.violations[0].starts_with(
                "the 1 slots chaos-w1 held came back 8.5 s after its kill at +4.000 s"
            ),
            "{:#?}",
            f.violations
        );
    }

    #[test]
    fn slots_that_come_back_after_the_bound_while_items_wait_are_a_violation() {
        let mut killed = b_killed_at(3.0);
        killed[0].bound = 1.5;
        let f = fleet_limit(&limited_run(), 2, &killed, 0.0);
        assert_eq!(f.violations.len(), 1, "{:#?}", f.violations);
        assert!(
            f.violations[0]
                .contains("came back 2.0 s after its kill at +3.000 s, while items waited"),
            "{}",
            f.violations[0]
        );
        // Without a backlog in the window, that proves nothing: vacuous, not a pass.
        let mut ev = limited_run();
        ev.changes.retain(|c| c.item <= 3);
        let f = fleet_limit(&ev, 2, &killed, 0.0);
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("vacuous: the backlog ran out")),
            "{:#?}",
            f.violations
        );
    }

    #[test]
    fn keyed_claims_one_after_another_in_enqueue_order_pass() {
        let (a, b) = ((id(1), A), (id(2), B));
        let ev = evidence(
            Vec::new(),
            vec![
                claim(1, 10, 1, a, 1.0),
                claim(3, 30, 1, a, 1.1),
                complete(1, 10, 1, a, 2.0),
                claim(2, 20, 1, b, 2.1),
                complete(2, 20, 1, b, 3.0),
                complete(3, 30, 1, a, 3.1),
            ],
            Vec::new(),
        );
        let k = keyed(&ev, &two_keys(), &[]);
        assert!(k.violations.is_empty(), "{:#?}", k.violations);
        assert_eq!((k.claims, k.handovers, k.claimed_twice), (3, 1, 0));
    }

    #[test]
    fn a_claim_while_the_keys_previous_claim_is_open_or_out_of_order_is_a_violation() {
        let (a, b) = ((id(1), A), (id(2), B));
        let ev = evidence(
            Vec::new(),
            vec![
                claim(2, 20, 1, a, 1.0),
                claim(1, 10, 1, b, 1.5),
                complete(2, 20, 1, a, 2.0),
                complete(1, 10, 1, b, 2.5),
            ],
            Vec::new(),
        );
        let k = keyed(&ev, &two_keys(), &[]);
        let all = k.violations.join("\n");
        assert!(all.contains("two claims of one key at once"), "{all}");
        assert!(all.contains("out of enqueue order"), "{all}");
        assert!(
            all.contains("item 1 (#0) completed after item 2 (#1)"),
            "{all}"
        );
    }

    #[test]
    fn a_head_reclaimed_from_a_killed_process_passes_and_from_a_live_one_does_not() {
        let (a, b) = ((id(1), A), (id(2), B));
        let ev = evidence(
            Vec::new(),
            vec![
                claim(1, 10, 1, a, 1.0),
                release(1, 10, 1, a.0, B, 5.0),
                reclaim(1, 10, 11, 1, b, 5.5),
                complete(1, 11, 2, b, 6.0),
            ],
            Vec::new(),
        );
        let killed = [Down {
            proc: A.into(),
            at: 2.0,
            until: None,
        }];
        let k = keyed(&ev, &two_keys(), &killed);
        assert!(k.violations.is_empty(), "{:#?}", k.violations);
        assert_eq!((k.after_kill, k.claimed_twice), (1, 1));
        let k = keyed(&ev, &two_keys(), &[]);
        assert!(
            k.violations[0].contains("neither killed nor stopped"),
            "{:#?}",
            k.violations
        );
        // Stopped, but its lease (until 4.0) ran out after the pause: not a justification.
        let early = [Down {
            proc: A.into(),
            at: 2.0,
            until: Some(3.0),
        }];
        assert_eq!(keyed(&ev, &two_keys(), &early).violations.len(), 1);
        let past_lease = [Down {
            proc: A.into(),
            at: 2.0,
            until: Some(5.2),
        }];
        let k = keyed(&ev, &two_keys(), &past_lease);
        assert!(k.violations.is_empty(), "{:#?}", k.violations);
        assert_eq!(k.after_stop, 1);
    }

    #[test]
    fn a_zombies_outcome_after_its_key_moved_on_is_a_violation() {
        let (a, b) = ((id(1), A), (id(2), B));
        let ev = evidence(
            Vec::new(),
            vec![
                claim(1, 10, 1, a, 1.0),
                reclaim(1, 10, 11, 1, b, 4.5),
                complete(1, 11, 2, b, 5.0),
                claim(2, 20, 1, b, 5.1),
                complete(1, 10, 1, a, 5.2),
                complete(2, 20, 1, b, 6.0),
            ],
            Vec::new(),
        );
        let paused = [Down {
            proc: A.into(),
            at: 2.0,
            until: Some(6.0),
        }];
        let k = keyed(&ev, &two_keys(), &paused);
        assert_eq!(k.violations.len(), 1, "{:#?}", k.violations);
        assert!(k.violations[0].contains("a zombie's late outcome passed the fence"));
        assert_eq!(k.after_stop, 1);
    }
}
