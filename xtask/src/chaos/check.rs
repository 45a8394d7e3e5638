//! The end-of-scenario checks, read from the database after every worker stopped.
//!
//! Sources: the items (`workpump.work`), the audit of every change the store made to them
//! (`chaos_audit`, written by a trigger, so no code path can skip it), the workers' ledger of
//! executions, the transactional effects, the suite's cancel requests. Each audit row is one
//! change, classified as:
//!
//! - **claim** — the claim token changed (only `claim_work` mints tokens); a reclaim of an
//!   orphan also appends the `lease_expired` entry that ends the previous claim;
//! - **outcome** — a running item left `running` under the same token through an execution's
//!   write: completed, failed (retry / dead letter / cancelled), or released by a drain;
//! - **store end** — a running orphan ended by the store (`lease_expired` entry: attempts
//!   used up, or a cancel requested);
//! - **release** — a dead instance's lease freed by a sweep (owner set to NULL);
//! - **operator cancel**, **promotion** — a waiting item cancelled, a scheduled one due.
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

use super::Result;

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
#[derive(Clone, sqlx::FromRow)]
pub(crate) struct Change {
    pub(crate) item: i64,
    pub(crate) from_state: String,
    pub(crate) to_state: String,
    pub(crate) from_instance: Option<Uuid>,
    pub(crate) to_instance: Option<Uuid>,
    pub(crate) from_token: Option<i64>,
    pub(crate) to_token: Option<i64>,
    pub(crate) from_attempt: i32,
    pub(crate) to_attempt: i32,
    pub(crate) error: Option<Value>,
    pub(crate) proc: String,
    pub(crate) at: f64,
}

/// What kind of change an audit row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Claim,
    Outcome,
    StoreEnd,
    Release,
    OperatorCancel,
    Promotion,
    Unexpected,
}

impl Change {
    pub(crate) fn kind(&self) -> Kind {
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
            ("running", "running") => Kind::Unexpected,
            ("running", _) if error_kind == Some("lease_expired") => Kind::StoreEnd,
            ("running", _) => Kind::Outcome,
            ("scheduled", "available") => Kind::Promotion,
            ("available" | "scheduled", "cancelled") => Kind::OperatorCancel,
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
}

impl Evidence {
    pub(crate) async fn load(pool: &PgPool) -> Result<Evidence> {
        let items = sqlx::query_as::<_, (i64, String, String, i32, Option<i64>, Value)>(
            "SELECT id, coalesce(payload->>'kind', 'noop'), state::text, attempt, claim_token, errors
             FROM workpump.work ORDER BY id",
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
            "SELECT item, from_state, to_state, from_instance, to_instance, from_token, to_token,
                    from_attempt, to_attempt, error, proc, extract(epoch FROM at)::float8 AS at
             FROM chaos_audit ORDER BY seq",
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
        let cancels = sqlx::query_as::<_, (i64, String)>("SELECT item, result FROM chaos_cancels")
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
        Ok(Evidence {
            items,
            changes,
            execs,
            effects,
            cancels,
            evicted,
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
    /// transitions, executions under claims the store never made).
    pub(crate) history: Vec<String>,
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
        let mut entries = 0usize;
        for c in changes {
            if c.error.is_some() {
                entries += 1;
            }
            match c.kind() {
                Kind::Claim => {
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
                    Some(a) => ended.push(a),
                    None => v.history.push(format!(
                        "item {}: the store ended an orphan without a history entry\n{}",
                        item.id,
                        evidence()
                    )),
                },
                Kind::Release | Kind::Promotion => {}
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
    for c in changes.iter().take(30) {
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
    /// Never ran again (should be 0).
    pub(crate) stuck: usize,
}

/// For the leases a fault at `at` took from `procs`, when each item ran again.
pub(crate) fn rerun(ev: &Evidence, at: f64, affected: &[(i64, i64)], procs: &[&str]) -> Rerun {
    let mut r = Rerun {
        affected: affected.len(),
        all_after: None,
        by_peer: 0,
        own_outcomes: 0,
        own_claims: 0,
        stuck: 0,
    };
    let mut latest: Option<f64> = None;
    for &(item, token) in affected {
        // The first change after the fault that ends this claim or starts another; a release
        // (by a sweep, or by the process's own drain) only hands the item on, so it is
        // skipped.
        let next = ev.changes_of(item).find(|c| {
            c.at >= at
                && (c.to_token != Some(token) || c.to_state != "running")
                && c.kind() != Kind::Release
                && !(c.kind() == Kind::Outcome && c.error.is_none() && c.to_state == "available")
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
                latest = Some(latest.map_or(c.at, |l: f64| l.max(c.at)));
            }
            None => r.stuck += 1,
        }
    }
    r.all_after = latest.map(|l| l - at);
    r
}

/// Per-kind counts for the notes.
pub(crate) fn kinds(ev: &Evidence) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in &ev.items {
        *m.entry(i.kind.clone()).or_default() += 1;
    }
    m
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
        Change {
            item,
            from_state: states.0.into(),
            to_state: states.1.into(),
            from_instance: owners.0,
            to_instance: owners.1,
            from_token: tokens.0,
            to_token: tokens.1,
            from_attempt: attempts.0,
            to_attempt: attempts.1,
            error,
            proc: proc.into(),
            at,
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

    fn evidence(items: Vec<Item>, changes: Vec<Change>, execs: Vec<Exec>) -> Evidence {
        Evidence {
            items,
            changes,
            execs,
            effects: HashMap::new(),
            cancels: HashMap::new(),
            evicted: HashMap::new(),
        }
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
}
