//! The pages: each reads the store through [`Operations`](workpump_coordinator::Operations)
//! and hands a template rows already written for people.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use workpump_coordinator::{
    GetWorkParams, InstanceSummary, ListHeldKeysParams, ListInstancesParams, ListWorkParams,
    QueueOverview, QueueOverviewParams, WorkFilter, WorkState, WorkSummary,
};

use crate::view::{self, render, store_error, Page};
use crate::AppState;

/// The states in the order a queue's life reads.
const STATES: [WorkState; 7] = [
    WorkState::Available,
    WorkState::Scheduled,
    WorkState::Blocked,
    WorkState::Running,
    WorkState::Completed,
    WorkState::Dead,
    WorkState::Cancelled,
];

/// A notice carried back by a redirect (`?notice=`).
#[derive(Deserialize, Default)]
pub(crate) struct Notice {
    notice: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// overview

/// One queue as the overview and the queue page show it.
pub(crate) struct QueueRow {
    pub(crate) name: String,
    pub(crate) paused: bool,
    pub(crate) registered: bool,
    pub(crate) available: String,
    pub(crate) scheduled: String,
    pub(crate) running: String,
    pub(crate) blocked: String,
    pub(crate) completed: String,
    pub(crate) dead: String,
    pub(crate) dead_items: u64,
    pub(crate) cancelled: String,
    pub(crate) lag: String,
    pub(crate) completed_rate: String,
    pub(crate) failed_rate: String,
    pub(crate) dead_rate: String,
    pub(crate) max_attempts: String,
    pub(crate) owner: String,
    /// The fleet-wide running limit: `unlimited` or the number.
    pub(crate) max_running: String,
    /// The fleet-wide rate limit: `unlimited` or `N per period`.
    pub(crate) rate_limit: String,
}

fn bounded(c: workpump_coordinator::Count) -> String {
    if c.exact {
        view::count(c.items)
    } else {
        format!("≥ {}", view::count(c.items))
    }
}

impl From<&QueueOverview> for QueueRow {
    fn from(q: &QueueOverview) -> QueueRow {
        let estimate = |r: workpump_coordinator::Rate| {
            if r.exact {
                view::rate(r.per_minute)
            } else {
                format!("~{}", view::rate(r.per_minute))
            }
        };
        QueueRow {
            name: q.queue.clone(),
            paused: q.paused,
            registered: q.registered,
            available: view::count(q.available),
            scheduled: view::count(q.scheduled),
            running: view::count(q.running),
            blocked: view::count(q.blocked),
            completed: bounded(q.completed),
            dead: bounded(q.dead),
            dead_items: q.dead.items,
            cancelled: bounded(q.cancelled),
            lag: q.pickup_lag.map_or_else(|| "—".to_owned(), view::duration),
            completed_rate: estimate(q.completed_per_minute),
            failed_rate: view::rate(q.failed_per_minute),
            dead_rate: estimate(q.dead_per_minute),
            max_attempts: q
                .max_attempts
                .map_or_else(|| "—".to_owned(), |m| m.to_string()),
            owner: q.owner.clone().unwrap_or_else(|| "nobody".to_owned()),
            max_running: q
                .max_running
                .map_or_else(|| "unlimited".to_owned(), |m| m.to_string()),
            rate_limit: q
                .rate_limit
                .map_or_else(|| "unlimited".to_owned(), |r| r.to_string()),
        }
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    page: Page,
    queues: Vec<QueueRow>,
    instances: usize,
    alive: usize,
}

pub(crate) async fn overview(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(notice): Query<Notice>,
) -> Response {
    let (queues, instances) = match tokio::try_join!(
        state.ops.queue_overview(QueueOverviewParams {}),
        state.ops.list_instances(ListInstancesParams {}),
    ) {
        Ok(both) => both,
        Err(e) => return store_error(&state, e),
    };
    let page = OverviewPage {
        page: Page::refreshing(&state, &headers, "Queues").with_notice(notice.notice),
        queues: queues.queues.iter().map(QueueRow::from).collect(),
        instances: instances.instances.len(),
        alive: instances
            .instances
            .iter()
            .filter(|i| i.alive_lock_held)
            .count(),
    };
    render(&page)
}

// ---------------------------------------------------------------------------------------------
// items

/// One item in a list.
pub(crate) struct ItemRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    /// Its job kind; empty when untyped.
    pub(crate) kind: String,
    pub(crate) state: &'static str,
    pub(crate) attempt: String,
    pub(crate) priority: i16,
    pub(crate) created: String,
    pub(crate) run_at: String,
    pub(crate) finished: String,
    pub(crate) owner: String,
    pub(crate) error: String,
}

impl ItemRow {
    fn new(w: &WorkSummary, now: DateTime<Utc>) -> ItemRow {
        ItemRow {
            id: w.id,
            queue: w.queue.clone(),
            kind: w.kind.clone().unwrap_or_default(),
            state: WorkState::as_str(w.state),
            attempt: format!("{}/{}", w.attempt, w.max_attempts),
            priority: w.priority,
            created: view::ago(w.created_at, now),
            run_at: view::ago(w.run_at, now),
            finished: w
                .finished_at
                .map_or_else(String::new, |t| view::ago(t, now)),
            owner: w
                .instance
                .map_or_else(String::new, |i| short_id(&i.0.to_string())),
            error: w
                .last_error
                .as_deref()
                .map_or_else(String::new, |e| view::truncate(e, 120)),
        }
    }
}

fn short_id(id: &str) -> String {
    id.chars().take(8).collect()
}

/// The filters of the items page, as its query string carries them.
#[derive(Deserialize, Default, Clone)]
pub(crate) struct ItemsQuery {
    queue: Option<String>,
    kind: Option<String>,
    state: Option<String>,
    error: Option<String>,
    cursor: Option<String>,
    notice: Option<String>,
}

impl ItemsQuery {
    fn filter(&self) -> Result<WorkFilter, String> {
        let mut filter = WorkFilter::new();
        if let Some(q) = self.queue.as_deref().filter(|q| !q.is_empty()) {
            filter = filter.queue(q);
        }
        if let Some(k) = self.kind.as_deref().filter(|k| !k.is_empty()) {
            filter = filter.kind(k);
        }
        if let Some(s) = self.state.as_deref().filter(|s| !s.is_empty()) {
            let state = WorkState::parse(s).ok_or_else(|| {
                format!("unknown state {s:?}: one of available, scheduled, running, completed, dead, cancelled")
            })?;
            filter = filter.state(state);
        }
        if let Some(e) = self.error.as_deref().filter(|e| !e.is_empty()) {
            filter = filter.error_contains(e);
        }
        Ok(filter)
    }

    /// The query string of these filters with another cursor.
    fn with_cursor(&self, cursor: &str) -> String {
        let mut pairs = Vec::new();
        for (k, v) in [
            ("queue", &self.queue),
            ("kind", &self.kind),
            ("state", &self.state),
            ("error", &self.error),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                pairs.push(format!("{k}={}", encode(v)));
            }
        }
        pairs.push(format!("cursor={}", encode(cursor)));
        pairs.join("&")
    }
}

/// Percent-encodes a query value.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Template)]
#[template(path = "items.html")]
struct ItemsPage {
    page: Page,
    items: Vec<ItemRow>,
    queue: String,
    kind: String,
    state: String,
    error: String,
    states: Vec<&'static str>,
    next: Option<String>,
    scan_exhausted: bool,
}

pub(crate) async fn items(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ItemsQuery>,
) -> Response {
    let filter = match q.filter() {
        Ok(filter) => filter,
        Err(why) => {
            return store_error(&state, workpump_coordinator::Error::InvalidArgument(why));
        }
    };
    let listed = state
        .ops
        .list_work(ListWorkParams {
            filter,
            cursor: q.cursor.clone().filter(|c| !c.is_empty()),
            page_size: Some(100),
        })
        .await;
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) => return store_error(&state, e),
    };
    let now = Utc::now();
    let page = ItemsPage {
        page: Page::refreshing(&state, &headers, "Items").with_notice(q.notice.clone()),
        items: listed.items.iter().map(|w| ItemRow::new(w, now)).collect(),
        queue: q.queue.clone().unwrap_or_default(),
        kind: q.kind.clone().unwrap_or_default(),
        state: q.state.clone().unwrap_or_default(),
        error: q.error.clone().unwrap_or_default(),
        states: STATES.iter().map(|s| s.as_str()).collect(),
        next: listed.next_cursor.as_deref().map(|c| q.with_cursor(c)),
        scan_exhausted: listed.scan_exhausted,
    };
    render(&page)
}

// ---------------------------------------------------------------------------------------------
// one queue

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    page: Page,
    queue: QueueRow,
    items: Vec<ItemRow>,
    queue_param: String,
    held: Vec<HeldKeyRow>,
}

/// An ordering key of the queue held by a dead letter.
struct HeldKeyRow {
    key: String,
    dead_id: i64,
    waiting: u64,
}

pub(crate) async fn queue(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let overview = match state.ops.queue_overview(QueueOverviewParams {}).await {
        Ok(o) => o,
        Err(e) => return store_error(&state, e),
    };
    let Some(row) = overview.get(&name) else {
        return store_error(&state, workpump_coordinator::Error::UnknownQueue(name));
    };
    let listed = state
        .ops
        .list_work(ListWorkParams {
            filter: WorkFilter::new().queue(&name),
            cursor: None,
            page_size: Some(20),
        })
        .await;
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) => return store_error(&state, e),
    };
    let held = state
        .ops
        .list_held_keys(ListHeldKeysParams {
            queue: Some(name.clone()),
            limit: 20,
        })
        .await;
    let held = match held {
        Ok(held) => held.keys,
        Err(e) => return store_error(&state, e),
    };
    let now = Utc::now();
    let page = QueuePage {
        page: Page::refreshing(&state, &headers, &format!("Queue {name}"))
            .with_notice(notice.notice),
        queue: QueueRow::from(row),
        items: listed.items.iter().map(|w| ItemRow::new(w, now)).collect(),
        queue_param: encode(&name),
        held: held
            .into_iter()
            .map(|k| HeldKeyRow {
                key: k.ordering_key,
                dead_id: k.dead_id,
                waiting: k.blocked,
            })
            .collect(),
    };
    render(&page)
}

// ---------------------------------------------------------------------------------------------
// one item

/// One entry of an item's timeline.
pub(crate) struct Moment {
    pub(crate) at: String,
    pub(crate) what: String,
}

/// One failed attempt (or the cancel) from the item's history.
pub(crate) struct Attempt {
    pub(crate) attempt: i64,
    pub(crate) at: String,
    pub(crate) kind: String,
    pub(crate) instance: String,
    pub(crate) error: String,
}

#[derive(Template)]
#[template(path = "item.html")]
struct ItemPage {
    page: Page,
    id: i64,
    queue: String,
    queue_param: String,
    state: &'static str,
    fields: Vec<(&'static str, String)>,
    payload: String,
    metadata: Option<String>,
    checkpoint: Option<String>,
    attempts: Vec<Attempt>,
    timeline: Vec<Moment>,
    may_retry: bool,
    may_cancel: bool,
    may_discard: bool,
}

pub(crate) async fn item(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Query(notice): Query<Notice>,
) -> Response {
    let got = match state.ops.get_work(GetWorkParams { id }).await {
        Ok(got) => got,
        Err(e) => return store_error(&state, e),
    };
    let (w, now) = (&got.item, got.now);
    let mut fields = vec![
        (
            "kind",
            w.kind.clone().unwrap_or_else(|| "(untyped)".to_owned()),
        ),
        ("state", WorkState::as_str(w.state).to_owned()),
        ("attempt", format!("{} of {}", w.attempt, w.max_attempts)),
        ("priority", w.priority.to_string()),
        (
            "created",
            format!(
                "{} ({})",
                view::time(w.created_at),
                view::ago(w.created_at, now)
            ),
        ),
        (
            "due",
            format!("{} ({})", view::time(w.run_at), view::ago(w.run_at, now)),
        ),
    ];
    if let Some(f) = w.finished_at {
        fields.push((
            "finished",
            format!("{} ({})", view::time(f), view::ago(f, now)),
        ));
    }
    if let Some(owner) = w.instance {
        fields.push(("owner", owner.0.to_string()));
    }
    if let Some(expiry) = w.lease_expiry {
        fields.push((
            "lease expires",
            format!("{} ({})", view::time(expiry), view::ago(expiry, now)),
        ));
    }
    if let Some(token) = w.claim_token {
        fields.push(("claim token", token.to_string()));
    }
    fields.push(("renewals", w.renewals.to_string()));
    if w.cancel_requested {
        fields.push(("cancel", "requested".to_owned()));
    }
    if let Some(key) = &w.unique_key {
        fields.push(("unique key", key.clone()));
    }
    if let Some(key) = &w.ordering_key {
        fields.push(("ordering key", key.clone()));
    }

    let attempts: Vec<Attempt> = w
        .history
        .iter()
        .map(|h| Attempt {
            attempt: h.attempt,
            at: h.at.map_or_else(String::new, view::time),
            kind: h.kind.clone(),
            instance: h.instance.as_deref().map_or_else(String::new, short_id),
            error: h.error.clone(),
        })
        .collect();

    let mut timeline = vec![(w.created_at, "enqueued".to_owned())];
    if w.run_at > w.created_at {
        timeline.push((w.run_at, "due".to_owned()));
    }
    for h in &w.history {
        if let Some(at) = h.at {
            timeline.push((at, format!("attempt {}: {}", h.attempt, h.kind)));
        }
    }
    if let Some(f) = w.finished_at {
        timeline.push((f, WorkState::as_str(w.state).to_owned()));
    }
    timeline.sort_by_key(|(at, _)| *at);

    let page = ItemPage {
        page: Page::new(&state, &headers, &format!("Item {id}")).with_notice(notice.notice),
        id,
        queue: w.queue.clone(),
        queue_param: encode(&w.queue),
        state: WorkState::as_str(w.state),
        fields,
        payload: view::pretty(&w.payload),
        metadata: w.metadata.as_ref().map(view::pretty),
        checkpoint: w.checkpoint.as_ref().map(view::pretty),
        attempts,
        timeline: timeline
            .into_iter()
            .map(|(at, what)| Moment {
                at: view::time(at),
                what,
            })
            .collect(),
        may_retry: w.state == WorkState::Dead,
        may_cancel: matches!(
            w.state,
            WorkState::Available | WorkState::Scheduled | WorkState::Blocked | WorkState::Running
        ) && !w.cancel_requested,
        may_discard: matches!(
            w.state,
            WorkState::Completed | WorkState::Dead | WorkState::Cancelled
        ),
    };
    render(&page)
}

// ---------------------------------------------------------------------------------------------
// instances

/// One instance as the instances page shows it.
pub(crate) struct InstanceRow {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) pid: String,
    pub(crate) version: String,
    pub(crate) started: String,
    pub(crate) beat: String,
    pub(crate) alive: bool,
    pub(crate) leases: String,
    pub(crate) in_flight: String,
    /// Its health as of its last beat (`metadata.health.status`: healthy, degraded,
    /// unhealthy), empty when it reports none (an older host, or a heartbeat worker of one's
    /// own that does not carry it).
    pub(crate) health: String,
    /// Why it is not healthy (`metadata.health.reasons`), one per line.
    pub(crate) health_reasons: Vec<String>,
}

impl InstanceRow {
    fn new(i: &InstanceSummary, now: DateTime<Utc>) -> InstanceRow {
        InstanceRow {
            id: i.instance.0.to_string(),
            host: i.host.clone(),
            pid: i.pid.map_or_else(String::new, |p| p.to_string()),
            version: i.version.clone().unwrap_or_default(),
            started: view::ago(i.started_at, now),
            beat: format!("{} ago", view::duration(i.heartbeat_age)),
            alive: i.alive_lock_held,
            leases: if i.expired_leases > 0 {
                format!("{} ({} expired)", i.leases, i.expired_leases)
            } else {
                i.leases.to_string()
            },
            in_flight: i
                .in_flight
                .iter()
                .map(|q| format!("{}: {}", q.queue, q.items))
                .collect::<Vec<_>>()
                .join(", "),
            health: i.metadata["health"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            health_reasons: i.metadata["health"]["reasons"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .filter_map(|r| r.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The badge class of its health.
    pub(crate) fn health_class(&self) -> &'static str {
        match self.health.as_str() {
            "healthy" => "s-completed",
            "degraded" => "s-running",
            "unhealthy" => "s-dead",
            _ => "s-cancelled",
        }
    }
}

#[derive(Template)]
#[template(path = "instances.html")]
struct InstancesPage {
    page: Page,
    instances: Vec<InstanceRow>,
}

pub(crate) async fn instances(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let listed = match state.ops.list_instances(ListInstancesParams {}).await {
        Ok(listed) => listed,
        Err(e) => return store_error(&state, e),
    };
    let now = Utc::now();
    let page = InstancesPage {
        page: Page::refreshing(&state, &headers, "Instances"),
        instances: listed
            .instances
            .iter()
            .map(|i| InstanceRow::new(i, now))
            .collect(),
    };
    render(&page)
}

// ---------------------------------------------------------------------------------------------
// dead letters

#[derive(Deserialize, Default)]
pub(crate) struct DeadQuery {
    queue: Option<String>,
    cursor: Option<String>,
    notice: Option<String>,
}

#[derive(Template)]
#[template(path = "dead.html")]
struct DeadPage {
    page: Page,
    items: Vec<ItemRow>,
    queue: String,
    queues: Vec<String>,
    next: Option<String>,
}

pub(crate) async fn dead(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<DeadQuery>,
) -> Response {
    let queue = q.queue.clone().filter(|q| !q.is_empty());
    let mut filter = WorkFilter::new().state(WorkState::Dead);
    if let Some(queue) = &queue {
        filter = filter.queue(queue);
    }
    let (listed, overview) = match tokio::try_join!(
        state.ops.list_work(ListWorkParams {
            filter,
            cursor: q.cursor.clone().filter(|c| !c.is_empty()),
            page_size: Some(100),
        }),
        state.ops.queue_overview(QueueOverviewParams {}),
    ) {
        Ok(both) => both,
        Err(e) => return store_error(&state, e),
    };
    let now = Utc::now();
    let next = listed.next_cursor.as_deref().map(|c| {
        let mut query = format!("cursor={}", encode(c));
        if let Some(queue) = &queue {
            query = format!("queue={}&{query}", encode(queue));
        }
        query
    });
    let page = DeadPage {
        page: Page::refreshing(&state, &headers, "Dead letters").with_notice(q.notice),
        items: listed.items.iter().map(|w| ItemRow::new(w, now)).collect(),
        queue: queue.unwrap_or_default(),
        queues: overview
            .queues
            .iter()
            .filter(|o| o.dead.items > 0)
            .map(|o| o.queue.clone())
            .collect(),
        next,
    };
    render(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(encode("emails.v2:eu-1"), "emails.v2%3Aeu-1");
    }

    #[test]
    fn the_next_page_keeps_every_filter() {
        let q = ItemsQuery {
            queue: Some("emails".into()),
            kind: Some("send email".into()),
            state: Some(String::new()),
            error: Some("smtp".into()),
            ..Default::default()
        };
        assert_eq!(
            q.with_cursor("v1.5"),
            "queue=emails&kind=send%20email&error=smtp&cursor=v1.5"
        );
    }
}
