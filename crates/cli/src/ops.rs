//! The operator's commands over the store's [`Operations`]: `queues`, `items list|show`,
//! `retry`, `cancel`, `discard`, `pause`, `resume`, `instances`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;
use workpump_coordinator::{
    BulkAction, BulkItem, BulkResult, BulkTotals, BulkWorkMatchingParams, BulkWorkParams,
    GetWorkParams, InstanceId, ListHeldKeysParams, ListInstancesParams, ListWorkOutcome,
    ListWorkParams, Operations, OrderingDeadHead, PauseQueueParams, QueueOverviewParams, RateLimit,
    ResumeQueueParams, SetQueueSettingsParams, WorkFilter, WorkState, MAX_BULK_BATCH,
    MAX_PAGE_SIZE,
};

use crate::failure::{ExitCode, Failure};
use crate::output::Output;

/// The most `list_work` calls one `items list` makes to fill its page (each examines at most
/// `LIST_SCAN_BUDGET` rows: 100 calls reach a million rows back).
const MAX_LIST_CALLS: usize = 100;

/// Which items: every criterion given must hold.
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct FilterArgs {
    /// In this queue (repeat for several).
    #[arg(long = "queue", value_name = "QUEUE")]
    queues: Vec<String>,
    /// In this state: available, scheduled, running, blocked, completed, dead, cancelled
    /// (repeat for several).
    #[arg(long = "state", value_name = "STATE", value_parser = parse_state)]
    states: Vec<WorkState>,
    /// Of this job kind (repeat for several; an untyped item has none).
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,
    /// Of this ordering key (repeat for several; an unkeyed item has none).
    #[arg(long = "ordering-key", value_name = "KEY")]
    ordering_keys: Vec<String>,
    /// Owned now by this instance (its id).
    #[arg(long, value_name = "ID")]
    instance: Option<uuid::Uuid>,
    /// Some failed attempt's error contains this text (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Created at or after: an RFC 3339 time, or an age (90s, 15m, 2h, 3d) meaning that long
    /// ago.
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    created_since: Option<DateTime<Utc>>,
    /// Created before (as --created-since).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    created_before: Option<DateTime<Utc>>,
    /// Finished at or after (as --created-since).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    finished_since: Option<DateTime<Utc>>,
    /// Finished before (as --created-since).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    finished_before: Option<DateTime<Utc>>,
}

impl FilterArgs {
    fn filter(&self) -> WorkFilter {
        let mut f = WorkFilter::new();
        for q in &self.queues {
            f = f.queue(q.clone());
        }
        for s in &self.states {
            f = f.state(*s);
        }
        for k in &self.kinds {
            f = f.kind(k.clone());
        }
        for k in &self.ordering_keys {
            f = f.ordering_key(k.clone());
        }
        if let Some(i) = self.instance {
            f = f.instance(InstanceId(i));
        }
        if let Some(e) = &self.error {
            f = f.error_contains(e.clone());
        }
        f.created(self.created_since, self.created_before)
            .finished(self.finished_since, self.finished_before)
    }
}

fn parse_state(name: &str) -> Result<WorkState, String> {
    WorkState::parse(name).ok_or_else(|| {
        format!(
            "unknown state {name:?}: one of available, scheduled, running, blocked, completed, dead, cancelled"
        )
    })
}

/// An RFC 3339 time, or an age (`90s`, `15m`, `2h`, `3d`) counted back from now.
fn parse_when(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits.parse().map_err(|_| bad_when(text))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3_600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(bad_when(text)),
    };
    let age = chrono::Duration::from_std(Duration::from_secs(secs)).map_err(|_| bad_when(text))?;
    Utc::now()
        .checked_sub_signed(age)
        .ok_or_else(|| bad_when(text))
}

fn bad_when(text: &str) -> String {
    format!(
        "{text:?} is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor an age (90s, 15m, 2h, 3d)"
    )
}

#[derive(Debug, Subcommand)]
pub(crate) enum ItemsCommand {
    /// A page of items, newest first.
    List(Box<ListArgs>),
    /// One item: payload, checkpoint, every failed attempt, owner and lease.
    Show {
        /// The item's id.
        id: i64,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Items on the page (1 to 500).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=(MAX_PAGE_SIZE as i64)))]
    limit: u32,
    /// Where the previous page stopped (its `next` cursor).
    #[arg(long)]
    cursor: Option<String>,
}

/// `retry`, `cancel` and `discard`: by ids, or every item a filter matches.
#[derive(Debug, Args)]
pub(crate) struct BulkArgs {
    /// The items' ids; or none, with a filter.
    ids: Vec<i64>,
    #[command(flatten)]
    filter: FilterArgs,
    /// With no id and no filter: act on every item the action applies to.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SettingsArgs {
    /// The queue's name.
    queue: String,
    /// Attempts an item of the queue gets unless it sets its own (1 to 1 000).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1000))]
    max_attempts: Option<i32>,
    /// Hand the queue's settings to this service (the one whose hosts declare it).
    #[arg(long, conflicts_with = "no_owner")]
    owner: Option<String>,
    /// Hand them to nobody: the next service that declares the queue adopts them.
    #[arg(long)]
    no_owner: bool,
    /// What a dead head of an ordering key does: `hold` (the key waits for an operator) or
    /// `skip` (the next item runs); docs/ordering.md.
    #[arg(long, value_parser = parse_dead_head)]
    ordering_dead_head: Option<OrderingDeadHead>,
    /// At most this many of the queue's items running across the whole fleet (1 to
    /// 1 000 000); docs/flow-control.md.
    #[arg(long, conflicts_with = "no_max_running",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_running: Option<u32>,
    /// Remove the running limit (unlimited).
    #[arg(long)]
    no_max_running: bool,
    /// At most this many of the queue's items started per `--rate-period-ms` across the
    /// fleet (1 to 1 000 000; a burst of up to this many after an idle period); with
    /// `--rate-period-ms`. A changed rate starts with a full bucket.
    #[arg(long, requires = "rate_period_ms", conflicts_with = "no_rate_limit",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate_limit: Option<u32>,
    /// The period of `--rate-limit` in milliseconds (1 to 86 400 000).
    #[arg(long, requires = "rate_limit",
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    rate_period_ms: Option<u64>,
    /// Remove the rate limit (unlimited).
    #[arg(long)]
    no_rate_limit: bool,
}

fn parse_dead_head(name: &str) -> Result<OrderingDeadHead, String> {
    OrderingDeadHead::parse(name)
        .map_err(|_| format!("unknown ordering_dead_head {name:?}: hold or skip"))
}

#[derive(Debug, Args)]
pub(crate) struct HeldKeysArgs {
    /// Only this queue's keys.
    #[arg(long, value_name = "QUEUE")]
    queue: Option<String>,
    /// At most this many keys (1 to 10 000), oldest dead letter first.
    #[arg(long, default_value_t = 100)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct QueueArg {
    /// The queue's name.
    queue: String,
}

fn ts(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// A rate limit as the listings show it: `100/1.0s`, or `unlimited`.
fn rate_text(rate: Option<RateLimit>) -> String {
    rate.map_or_else(
        || "unlimited".to_owned(),
        |r| format!("{}/{}", r.limit, secs(r.period)),
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

pub(crate) async fn queues(ops: &dyn Operations, out: &Output) -> Result<(), Failure> {
    let o = ops
        .queue_overview(QueueOverviewParams {})
        .await
        .map_err(Failure::from_store)?;
    if out.json() {
        out.print_json(&o);
        return Ok(());
    }
    let bound = |c: workpump_coordinator::Count| {
        if c.exact {
            c.items.to_string()
        } else {
            format!(">={}", c.items)
        }
    };
    let rows: Vec<Vec<String>> = o
        .queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                if q.paused { "paused" } else { "" }.to_owned(),
                q.owner.clone().unwrap_or_default(),
                q.available.to_string(),
                q.scheduled.to_string(),
                // Against the fleet-wide limit, when the queue has one.
                match q.max_running {
                    Some(limit) => format!("{}/{limit}", q.running),
                    None => q.running.to_string(),
                },
                q.blocked.to_string(),
                q.pickup_lag.map_or_else(|| "-".to_owned(), secs),
                format!("{:.1}", q.completed_per_minute.per_minute),
                format!("{:.1}", q.failed_per_minute),
                format!("{:.1}", q.dead_per_minute.per_minute),
                bound(q.completed),
                bound(q.dead),
                bound(q.cancelled),
                q.rate_limit
                    .map_or_else(|| "-".to_owned(), |r| rate_text(Some(r))),
            ]
        })
        .collect();
    out.print_table(
        &[
            "queue",
            "",
            "owner",
            "available",
            "scheduled",
            "running",
            "blocked",
            "lag",
            "done/min",
            "failed/min",
            "dead/min",
            "completed",
            "dead",
            "cancelled",
            "rate",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn items(
    ops: &dyn Operations,
    out: &Output,
    command: ItemsCommand,
) -> Result<(), Failure> {
    match command {
        ItemsCommand::List(args) => {
            // A selective filter may fill a page only after several calls (each examines a
            // bounded number of rows): go on until the page is full, the store is scanned
            // to its oldest item, or MAX_LIST_CALLS calls were made.
            let filter = args.filter.filter();
            let mut page = ListWorkOutcome::default();
            let mut cursor = args.cursor;
            for _ in 0..MAX_LIST_CALLS {
                let left = args.limit - page.items.len() as u32;
                let part = ops
                    .list_work(ListWorkParams {
                        filter: filter.clone(),
                        cursor: cursor.clone(),
                        page_size: Some(left),
                    })
                    .await
                    .map_err(Failure::from_store)?;
                page.items.extend(part.items);
                page.next_cursor = part.next_cursor;
                page.scan_exhausted = part.scan_exhausted;
                cursor = page.next_cursor.clone();
                if page.items.len() as u32 >= args.limit || cursor.is_none() {
                    break;
                }
            }
            if out.json() {
                out.print_json(&page);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = page
                .items
                .iter()
                .map(|w| {
                    vec![
                        w.id.to_string(),
                        w.queue.clone(),
                        w.kind.clone().unwrap_or_default(),
                        WorkState::as_str(w.state).to_owned(),
                        format!("{}/{}", w.attempt, w.max_attempts),
                        ts(w.created_at),
                        w.finished_at.map(ts).unwrap_or_default(),
                        w.last_error
                            .as_deref()
                            .map(|e| e.chars().take(60).collect())
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            out.print_table(
                &[
                    "id",
                    "queue",
                    "kind",
                    "state",
                    "attempt",
                    "created",
                    "finished",
                    "last error",
                ],
                &rows,
            );
            if page.scan_exhausted && (page.items.len() as u32) < args.limit {
                println!(
                    "(the page is short: {MAX_LIST_CALLS} calls examined their rows without filling it; go on with the cursor)"
                );
            }
            if let Some(next) = page.next_cursor {
                println!("next page: --cursor {next}");
            }
            Ok(())
        }
        ItemsCommand::Show { id } => {
            let got = ops
                .get_work(GetWorkParams { id })
                .await
                .map_err(Failure::from_store)?;
            if out.json() {
                out.print_json(&got);
                return Ok(());
            }
            let w = &got.item;
            let mut rows = vec![
                vec!["id".to_owned(), w.id.to_string()],
                vec!["queue".to_owned(), w.queue.clone()],
                vec![
                    "kind".to_owned(),
                    w.kind.clone().unwrap_or_else(|| "(untyped)".to_owned()),
                ],
                vec!["state".to_owned(), WorkState::as_str(w.state).to_owned()],
                vec![
                    "attempt".to_owned(),
                    format!("{} of {}", w.attempt, w.max_attempts),
                ],
                vec!["priority".to_owned(), w.priority.to_string()],
                vec!["created".to_owned(), ts(w.created_at)],
                vec!["due".to_owned(), ts(w.run_at)],
            ];
            let mut push = |k: &str, v: Option<String>| {
                if let Some(v) = v {
                    rows.push(vec![k.to_owned(), v]);
                }
            };
            push("finished", w.finished_at.map(ts));
            push("owner", w.instance.map(|i| i.0.to_string()));
            push("lease expires", w.lease_expiry.map(ts));
            push("claim token", w.claim_token.map(|t| t.to_string()));
            push("renewals", Some(w.renewals.to_string()));
            push(
                "cancel requested",
                w.cancel_requested.then(|| "yes".to_owned()),
            );
            push("unique key", w.unique_key.clone());
            push("ordering key", w.ordering_key.clone());
            out.print_table(&["field", "value"], &rows);
            println!("\npayload:\n{}", pretty(&w.payload));
            if let Some(m) = &w.metadata {
                println!("\nmetadata:\n{}", pretty(m));
            }
            if let Some(c) = &w.checkpoint {
                println!("\ncheckpoint:\n{}", pretty(c));
            }
            if !w.history.is_empty() {
                println!();
                let rows: Vec<Vec<String>> = w
                    .history
                    .iter()
                    .map(|h| {
                        vec![
                            h.attempt.to_string(),
                            h.at.map(ts).unwrap_or_default(),
                            h.kind.clone(),
                            h.instance.clone().unwrap_or_default(),
                            h.error.clone(),
                        ]
                    })
                    .collect();
                out.print_table(&["attempt", "at", "how", "instance", "error"], &rows);
            }
            Ok(())
        }
    }
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// What a bulk command did, for `--json`.
#[derive(Serialize)]
struct BulkReport<'a> {
    action: &'static str,
    applied: u64,
    refused: u64,
    /// Per id, when ids were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    items: Option<&'a [BulkItem]>,
    /// The batches, when a filter was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    totals: Option<BulkTotals>,
}

pub(crate) async fn bulk(
    ops: &dyn Operations,
    out: &Output,
    action: BulkAction,
    args: BulkArgs,
) -> Result<(), Failure> {
    let mut filter = args.filter.filter();
    if !args.ids.is_empty() {
        if !filter.is_empty() || args.all {
            return Err(Failure::usage(
                "give item ids or a filter (or --all), not both",
            ));
        }
        let mut items = Vec::new();
        for chunk in args.ids.chunks(MAX_BULK_BATCH as usize) {
            let done = ops
                .bulk_work(BulkWorkParams {
                    action,
                    ids: chunk.to_vec(),
                })
                .await
                .map_err(Failure::from_store)?;
            items.extend(done.items);
        }
        let applied = items.iter().filter(|i| i.result.applied()).count() as u64;
        let refused = items.len() as u64 - applied;
        if out.json() {
            out.print_json(&BulkReport {
                action: action.as_str(),
                applied,
                refused,
                items: Some(&items),
                totals: None,
            });
        } else {
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|i| {
                    let (result, why) = match &i.result {
                        BulkResult::Retried => ("retried", String::new()),
                        BulkResult::Cancelled => ("cancelled", String::new()),
                        BulkResult::Requested => ("cancel requested", String::new()),
                        BulkResult::Discarded => ("discarded", String::new()),
                        BulkResult::Promoted => ("due now", String::new()),
                        BulkResult::Refused { reason, .. } => ("refused", reason.clone()),
                        BulkResult::NotFound => ("not found", String::new()),
                        #[allow(unreachable_patterns)]
                        _ => ("", String::new()),
                    };
                    vec![
                        i.id.to_string(),
                        i.state_before
                            .map(WorkState::as_str)
                            .unwrap_or("-")
                            .to_owned(),
                        result.to_owned(),
                        why,
                    ]
                })
                .collect();
            out.print_table(&["id", "was", "result", "why"], &rows);
        }
        if refused > 0 {
            return Err(Failure::new(
                ExitCode::Refused,
                format!(
                    "{} of {} item(s) were refused or not found (each listed above); the others were changed",
                    refused,
                    items.len()
                ),
            ));
        }
        return Ok(());
    }

    if filter.is_empty() && !args.all {
        return Err(Failure::usage(format!(
            "{} what? give item ids, a filter (--queue, --kind, --state, --error, ...), or --all for every item it applies to",
            action.as_str()
        )));
    }
    // A retry applies to dead letters only: say so to the store instead of having it refuse
    // every other match.
    if action == BulkAction::Retry && filter.states.is_empty() {
        filter = filter.state(WorkState::Dead);
    }
    let mut params = BulkWorkMatchingParams::new(action, filter);
    params.all = args.all;
    let totals = ops
        .bulk_work_matching_all(params)
        .await
        .map_err(Failure::from_store)?;
    if out.json() {
        out.print_json(&BulkReport {
            action: action.as_str(),
            applied: totals.applied,
            refused: totals.refused,
            items: None,
            totals: Some(totals),
        });
    } else {
        println!(
            "{}: {} item(s) changed, {} refused, in {} batch(es) of at most {MAX_BULK_BATCH}",
            action.as_str(),
            totals.applied,
            totals.refused,
            totals.batches
        );
    }
    Ok(())
}

pub(crate) async fn pause(
    ops: &dyn Operations,
    out: &Output,
    arg: QueueArg,
    pause: bool,
) -> Result<(), Failure> {
    let changed = if pause {
        ops.pause_queue(PauseQueueParams {
            queue: arg.queue.clone(),
        })
        .await
        .map(|o| o.changed)
    } else {
        ops.resume_queue(ResumeQueueParams {
            queue: arg.queue.clone(),
        })
        .await
        .map(|o| o.changed)
    }
    .map_err(Failure::from_store)?;
    let verb = if pause { "paused" } else { "resumed" };
    if out.json() {
        out.print_json(
            &serde_json::json!({ "queue": arg.queue, "paused": pause, "changed": changed }),
        );
    } else if changed {
        println!(
            "queue {:?} {verb}{}",
            arg.queue,
            if pause {
                ": claims stop within one poll; running items finish"
            } else {
                ""
            }
        );
    } else {
        println!("queue {:?} was already {verb}: nothing changed", arg.queue);
    }
    Ok(())
}

pub(crate) async fn settings(
    ops: &dyn Operations,
    out: &Output,
    args: SettingsArgs,
) -> Result<(), Failure> {
    let owner = match (args.owner, args.no_owner) {
        (Some(owner), _) => Some(Some(owner)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let max_running = match (args.max_running, args.no_max_running) {
        (Some(n), _) => Some(Some(n)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let rate_limit = match (args.rate_limit, args.rate_period_ms, args.no_rate_limit) {
        (Some(limit), Some(ms), _) => Some(Some(RateLimit::new(limit, Duration::from_millis(ms)))),
        (_, _, true) => Some(None),
        _ => None,
    };
    let changed = args.max_attempts.is_some()
        || owner.is_some()
        || args.ordering_dead_head.is_some()
        || max_running.is_some()
        || rate_limit.is_some();
    let now = ops
        .set_queue_settings(SetQueueSettingsParams {
            ordering_dead_head: args.ordering_dead_head,
            max_running,
            rate_limit,
            queue: args.queue.clone(),
            max_attempts: args.max_attempts,
            owner,
        })
        .await
        .map_err(Failure::from_store)?;
    if out.json() {
        out.print_json(&serde_json::json!({
            "queue": args.queue,
            "max_attempts": now.max_attempts,
            "owner": now.owner,
            "ordering_dead_head": now.ordering_dead_head,
            "max_running": now.max_running,
            "rate_limit": now.rate_limit,
        }));
    } else {
        println!(
            "queue {:?}{}: max_attempts {}, owner {}, ordering_dead_head {}, max_running {}, rate {}",
            args.queue,
            if changed { " now" } else { "" },
            now.max_attempts,
            now.owner.as_deref().unwrap_or("nobody"),
            now.ordering_dead_head,
            now.max_running
                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
            rate_text(now.rate_limit)
        );
    }
    Ok(())
}

pub(crate) async fn instances(ops: &dyn Operations, out: &Output) -> Result<(), Failure> {
    let listed = ops
        .list_instances(ListInstancesParams {})
        .await
        .map_err(Failure::from_store)?;
    if out.json() {
        out.print_json(&listed);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = listed
        .instances
        .iter()
        .map(|i| {
            vec![
                i.instance.0.to_string(),
                i.host.clone(),
                i.pid.map(|p| p.to_string()).unwrap_or_default(),
                i.version.clone().unwrap_or_default(),
                secs(i.heartbeat_age),
                if i.alive_lock_held {
                    "held"
                } else {
                    "NOT HELD"
                }
                .to_owned(),
                i.leases.to_string(),
                i.in_flight
                    .iter()
                    .map(|q| format!("{}:{}", q.queue, q.items))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        })
        .collect();
    out.print_table(
        &[
            "instance",
            "host",
            "pid",
            "version",
            "beat age",
            "alive-lock",
            "leases",
            "in flight",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn held_keys(
    ops: &dyn Operations,
    out: &Output,
    args: HeldKeysArgs,
) -> Result<(), Failure> {
    let held = ops
        .list_held_keys(ListHeldKeysParams {
            queue: args.queue,
            limit: args.limit,
        })
        .await
        .map_err(Failure::from_store)?;
    if out.json() {
        out.print_json(&held);
        return Ok(());
    }
    if held.keys.is_empty() {
        println!("No ordering key is held by a dead letter.");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = held
        .keys
        .iter()
        .map(|k| {
            vec![
                k.queue.clone(),
                k.ordering_key.clone(),
                k.dead_id.to_string(),
                k.blocked.to_string(),
            ]
        })
        .collect();
    out.print_table(&["queue", "ordering key", "dead letter", "waiting"], &rows);
    println!(
        "Retry a dead letter (workpump retry ID) to run it again first, or discard it \
         (workpump discard ID) to let the next item of its key run."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_rfc_3339_or_an_age() {
        let t = parse_when("2026-12-01T10:00:00Z").expect("rfc 3339");
        assert_eq!(t.to_rfc3339(), "2026-12-01T10:00:00+00:00");
        let ago = Utc::now() - parse_when("2h").expect("an age");
        assert!((ago.num_seconds() - 7_200).abs() <= 5, "{ago}");
        for bad in ["", "2", "2w", "h", "yesterday", "-3h"] {
            let e = parse_when(bad).expect_err(bad);
            assert!(e.contains("RFC 3339"), "{e}");
        }
    }
}
