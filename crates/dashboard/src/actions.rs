//! The changes: retry, cancel or discard one item; pause or resume a queue; retry or
//! discard many items after a confirmation. Each is a `POST` checked by
//! [`authorize`](crate::session::authorize) before the store is called.

use askama::Template;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use workpump_coordinator::{
    BulkAction, BulkResult, BulkWorkMatchingParams, BulkWorkParams, Error, PauseQueueParams,
    ResumeQueueParams, WorkFilter, WorkState, MAX_BULK_BATCH,
};

use crate::pages::encode;
use crate::session::{authorize, refuse};
use crate::view::{self, render, store_error, Page};
use crate::AppState;

fn parse_action(name: &str) -> Option<BulkAction> {
    match name {
        "retry" => Some(BulkAction::Retry),
        "cancel" => Some(BulkAction::Cancel),
        "discard" => Some(BulkAction::Discard),
        _ => None,
    }
}

/// The form's fields, as pairs (a form may repeat `id`).
type Fields = Vec<(String, String)>;

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn redirect_with(path: String, notice: &str) -> Response {
    let separator = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{path}{separator}notice={}", encode(notice))).into_response()
}

/// `POST /items/{id}/{retry|cancel|discard}`.
pub(crate) async fn item_action(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(fields): Form<Fields>,
) -> Response {
    if let Err(refused) = authorize(&state, &headers, field(&fields, "csrf").unwrap_or("")) {
        return *refused;
    }
    let Some(bulk_action) = parse_action(&action) else {
        return refuse(
            StatusCode::NOT_FOUND,
            &state,
            &format!("unknown action {action:?}: retry, cancel or discard"),
        );
    };
    let done = state
        .ops
        .bulk_work(BulkWorkParams {
            action: bulk_action,
            ids: vec![id],
        })
        .await;
    let item = match done.map(|d| d.items.into_iter().next()) {
        Ok(Some(item)) => item,
        Ok(None) => return store_error(&state, Error::NotFound { id }),
        Err(e) => return store_error(&state, e),
    };
    let base = &state.config.base_path;
    match item.result {
        BulkResult::NotFound => store_error(&state, Error::NotFound { id }),
        BulkResult::Refused { state: s, reason } => store_error(
            &state,
            Error::InvalidState {
                id,
                state: s,
                reason,
            },
        ),
        BulkResult::Discarded => {
            redirect_with(format!("{base}/items"), &format!("item {id} discarded"))
        }
        result => {
            let what = match result {
                BulkResult::Retried => "retried: available again",
                BulkResult::Cancelled => "cancelled",
                BulkResult::Requested => {
                    "cancel requested: its handler is told at its next renewal"
                }
                _ => "changed",
            };
            redirect_with(format!("{base}/items/{id}"), &format!("item {id} {what}"))
        }
    }
}

/// `POST /queues/{queue}/{pause|resume}`.
pub(crate) async fn queue_action(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((queue, action)): Path<(String, String)>,
    Form(fields): Form<Fields>,
) -> Response {
    if let Err(refused) = authorize(&state, &headers, field(&fields, "csrf").unwrap_or("")) {
        return *refused;
    }
    let changed = match action.as_str() {
        "pause" => state
            .ops
            .pause_queue(PauseQueueParams {
                queue: queue.clone(),
            })
            .await
            .map(|o| o.changed),
        "resume" => state
            .ops
            .resume_queue(ResumeQueueParams {
                queue: queue.clone(),
            })
            .await
            .map(|o| o.changed),
        _ => {
            return refuse(
                StatusCode::NOT_FOUND,
                &state,
                &format!("unknown action {action:?}: pause or resume"),
            )
        }
    };
    match changed {
        Ok(changed) => {
            let notice = match (action.as_str(), changed) {
                ("pause", true) => format!(
                    "queue {queue} paused: claims stop within one poll, running items finish"
                ),
                ("pause", false) => format!("queue {queue} was already paused"),
                (_, true) => format!("queue {queue} resumed"),
                (_, false) => format!("queue {queue} was not paused"),
            };
            redirect_with(
                format!("{}/queues/{}", state.config.base_path, encode(&queue)),
                &notice,
            )
        }
        Err(e) => store_error(&state, e),
    }
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    page: Page,
    action: &'static str,
    what: String,
    fields: Fields,
}

#[derive(Template)]
#[template(path = "bulk_done.html")]
struct BulkDonePage {
    page: Page,
    action: &'static str,
    applied: u64,
    refused: Vec<(i64, String)>,
    back: String,
}

/// `POST /bulk`: `action` (retry or discard) on the checked `id`s, or with `scope=queue` on
/// every dead letter of `queue`. Without `confirm=yes` it shows what it would do and asks;
/// nothing changes until then.
pub(crate) async fn bulk(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    let csrf = field(&fields, "csrf").unwrap_or("").to_owned();
    if let Err(refused) = authorize(&state, &headers, &csrf) {
        return *refused;
    }
    let action = match field(&fields, "action").and_then(parse_action) {
        Some(a @ (BulkAction::Retry | BulkAction::Discard)) => a,
        _ => {
            return refuse(
                StatusCode::BAD_REQUEST,
                &state,
                "a bulk change is retry or discard of dead letters: nothing was changed",
            )
        }
    };
    let ids: Result<Vec<i64>, _> = fields
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.parse::<i64>())
        .collect();
    let Ok(ids) = ids else {
        return refuse(
            StatusCode::BAD_REQUEST,
            &state,
            "an item id is not a number: nothing was changed",
        );
    };
    let queue = field(&fields, "queue")
        .filter(|q| !q.is_empty())
        .map(str::to_owned);
    let whole_queue = field(&fields, "scope") == Some("queue");
    let base = state.config.base_path.clone();
    let back = match &queue {
        Some(q) => format!("{base}/dead?queue={}", encode(q)),
        None => format!("{base}/dead"),
    };

    if whole_queue && queue.is_none() {
        return refuse(
            StatusCode::BAD_REQUEST,
            &state,
            "choose the queue whose dead letters to change: nothing was changed",
        );
    }
    if !whole_queue && ids.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            &state,
            "no item was checked: nothing was changed",
        );
    }
    if ids.len() > MAX_BULK_BATCH as usize {
        return refuse(
            StatusCode::BAD_REQUEST,
            &state,
            &format!("at most {MAX_BULK_BATCH} items at once: nothing was changed"),
        );
    }

    if field(&fields, "confirm") != Some("yes") {
        let what = if whole_queue {
            let queue = queue.as_deref().unwrap_or_default();
            format!("every dead letter of queue {queue}")
        } else {
            format!(
                "{} checked dead letter(s): {}",
                ids.len(),
                ids.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let page = ConfirmPage {
            page: Page::new(&state, &headers, "Confirm"),
            action: action.as_str(),
            what: view::truncate(&what, 600),
            fields: fields
                .into_iter()
                .filter(|(k, _)| k != "confirm" && k != "csrf")
                .collect(),
        };
        return render(&page);
    }

    let (applied, refused) = if whole_queue {
        let filter = WorkFilter::new()
            .state(WorkState::Dead)
            .queue(queue.clone().unwrap_or_default());
        match state
            .ops
            .bulk_work_matching_all(BulkWorkMatchingParams::new(action, filter))
            .await
        {
            Ok(totals) => (totals.applied, Vec::new()),
            Err(e) => return store_error(&state, e),
        }
    } else {
        match state.ops.bulk_work(BulkWorkParams { action, ids }).await {
            Ok(done) => {
                let applied = done.items.iter().filter(|i| i.result.applied()).count() as u64;
                let refused = done
                    .items
                    .iter()
                    .filter_map(|i| match &i.result {
                        BulkResult::Refused { reason, .. } => Some((i.id, reason.clone())),
                        BulkResult::NotFound => Some((i.id, "not found".to_owned())),
                        _ => None,
                    })
                    .collect();
                (applied, refused)
            }
            Err(e) => return store_error(&state, e),
        }
    };
    let page = BulkDonePage {
        page: Page::new(&state, &headers, "Done"),
        action: action.as_str(),
        applied,
        refused,
        back,
    };
    render(&page)
}
