//! An axum service that embeds the host. `POST /orders` writes an order and enqueues its
//! receipt in the same transaction (both commit, or neither); the `receipts` handler marks
//! the order in a fenced transaction (the mark and the completion commit together, so it
//! happens once). `/health` reports the host's health (200 when ready, else 503),
//! `/metrics` renders every workpump metric for Prometheus, and `/workpump` is the
//! operator's dashboard nested in the service's router (read-only unless
//! `WORKPUMP_DASHBOARD_TOKEN` is set).
//!
//! ```sh
//! cargo xtask pg start    # starts the throwaway PostgreSQL and prints its URL
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin axum-service
//! curl -s localhost:3000/orders -H 'content-type: application/json' \
//!      -d '{"customer": "ada", "amount_cents": 1250}'
//! curl -s localhost:3000/orders/1       # receipt_sent_at is set once the receipt ran
//! curl -s localhost:3000/health
//! curl -s localhost:3000/metrics | grep workpump_items_total
//! open http://localhost:3000/workpump    # the dashboard
//! ```
//!
//! `LISTEN` changes the address (default `127.0.0.1:3000`); `WORKPUMP_*` variables change the
//! host's settings. Ctrl-C (or SIGTERM) drains the host, then stops the server.
//!
//! The metrics: the `metrics` recorder is process-wide, one per process. This service
//! installs it itself (a [`PrometheusHandle`] that renders on its own router) and keeps the
//! host's own listener off (`metrics.enabled = false`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use workpump_dashboard::{Access, DashboardConfig};
use workpump_host::coordinator::EnqueueWorkParams;
use workpump_host::{handler_fn, Host, HostConfig, HostHandle, Job, NewWork};

/// The queue of receipts to send.
const RECEIPTS: &str = "receipts";

#[derive(Clone)]
struct App {
    host: HostHandle,
    pool: PgPool,
    metrics: PrometheusHandle,
}

#[derive(Deserialize)]
struct NewOrder {
    customer: String,
    amount_cents: i64,
}

#[derive(Serialize, sqlx::FromRow)]
struct Order {
    id: i64,
    customer: String,
    amount_cents: i64,
    receipt_sent_at: Option<String>,
}

#[derive(Deserialize)]
struct Receipt {
    order: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let listen: SocketAddr = std::env::var("LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
        .map_err(|e| format!("LISTEN: {e}"))?;

    // One recorder per process: ours, rendered on our router; then every workpump metric is
    // described on it.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    workpump_host::metrics::describe();

    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
             id              bigserial PRIMARY KEY,
             customer        text      NOT NULL,
             amount_cents    bigint    NOT NULL,
             receipt_sent_at timestamptz
         )",
    )
    .execute(&pool)
    .await?;

    let mut config = HostConfig::load(None)?;
    config.metrics.enabled = false; // the recorder above serves /metrics
    let host = Host::builder()
        .config(config)
        .pool(pool.clone())
        .handler(RECEIPTS, handler_fn(send_receipt))
        .start()
        .await?;

    let app = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(show_order))
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .with_state(App {
            host: host.clone(),
            pool,
            metrics,
        });
    // The operator's dashboard under /workpump: changes need a login with
    // WORKPUMP_DASHBOARD_TOKEN; without it, it is read-only.
    let store = host.pg().cloned().ok_or("the host runs on PostgreSQL")?;
    let mut dashboard = DashboardConfig::default();
    dashboard.base_path = "/workpump".to_owned();
    if let Ok(token) = std::env::var("WORKPUMP_DASHBOARD_TOKEN") {
        dashboard.access = Access::Token(token);
    }
    let app = app.nest(
        "/workpump",
        workpump_dashboard::router(Arc::new(store), dashboard)?,
    );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!("listening on http://{listen}");
    let drained = host.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            // SIGINT/SIGTERM: the host drains first; then the server stops.
            if let Err(e) = drained.run_until_signal().await {
                tracing::error!("the host stopped with an error: {e}");
            }
        })
        .await?;
    host.stopped().await?;
    Ok(())
}

/// The handler of `receipts`: "sends" the receipt and marks the order, exactly once — the
/// mark and the item's completion commit in one transaction that holds the lease.
async fn send_receipt(job: Job<Receipt>) -> workpump_host::JobResult {
    let order = job.payload().order;
    tracing::info!(
        "sending the receipt of order {order} (attempt {})",
        job.attempt()
    );
    let mut tx = job.begin_transaction().await?;
    sqlx::query("UPDATE orders SET receipt_sent_at = now() WHERE id = $1")
        .bind(order)
        .execute(tx.connection())
        .await?;
    tx.complete().await
}

/// `POST /orders`: the order and its receipt's work item commit together.
async fn create_order(
    State(app): State<App>,
    Json(order): Json<NewOrder>,
) -> Result<Response, AppError> {
    if order.customer.trim().is_empty() || order.amount_cents <= 0 {
        return Err(AppError::BadRequest(
            "customer must not be empty and amount_cents must be positive".into(),
        ));
    }
    let (Some(pg), true) = (app.host.pg(), app.host.health().schema_ready) else {
        return Err(AppError::NotReady);
    };
    let mut tx = app.pool.begin().await?;
    let (id,): (i64,) =
        sqlx::query_as("INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id")
            .bind(&order.customer)
            .bind(order.amount_cents)
            .fetch_one(&mut *tx)
            .await?;
    let enqueued = pg
        .enqueue_with(
            &mut tx,
            EnqueueWorkParams {
                items: vec![NewWork::new(RECEIPTS, json!({ "order": id }))],
            },
        )
        .await
        .map_err(|e| AppError::Internal(e.to_string()))?;
    tx.commit().await?;
    let work = enqueued.items.first().map(|i| i.id);
    Ok((
        StatusCode::CREATED,
        Json(json!({ "order": id, "work": work })),
    )
        .into_response())
}

/// `GET /orders/{id}`.
async fn show_order(State(app): State<App>, Path(id): Path<i64>) -> Result<Response, AppError> {
    let order: Option<Order> = sqlx::query_as(
        "SELECT id, customer, amount_cents, receipt_sent_at::text AS receipt_sent_at
         FROM orders WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&app.pool)
    .await?;
    match order {
        Some(order) => Ok(Json(order).into_response()),
        None => Ok((StatusCode::NOT_FOUND, "no such order").into_response()),
    }
}

/// `GET /health`: the host's health as JSON; 200 when ready for work, else 503.
async fn health(State(app): State<App>) -> Response {
    let health = app.host.health();
    let status = if health.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn render_metrics(State(app): State<App>) -> String {
    // Histograms are summarised on upkeep; with no upkeep task of its own, do it here.
    app.metrics.run_upkeep();
    app.metrics.render()
}

/// What a request can fail with.
enum AppError {
    BadRequest(String),
    NotReady,
    Internal(String),
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        AppError::Internal(e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::BadRequest(m) => (StatusCode::BAD_REQUEST, m).into_response(),
            AppError::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the work queue is not ready yet (migrating); try again",
            )
                .into_response(),
            AppError::Internal(m) => {
                tracing::error!("request failed: {m}");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
            }
        }
    }
}
