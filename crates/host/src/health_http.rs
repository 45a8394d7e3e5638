//! The health endpoints (`[health] listen`): what an orchestrator probes.
//!
//! - `GET /livez`: 200 `live` unless the host is unhealthy (a worker gave up, the host stopped
//!   with an error), then 503 with the reasons. A store outage is degraded, not unhealthy:
//!   restarting the process would not bring the database back, and every instance would
//!   restart at once.
//! - `GET /readyz`: 200 `ready` when [`Health::ready`](crate::Health::ready), else 503 with
//!   what is missing.
//! - `GET /health`: the [`Health`](crate::Health) as JSON; 200 unless unhealthy (503).
//!
//! Served on its own listener (the Prometheus exporter owns its own) until the host has
//! stopped.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::net::TcpListener;

use crate::{HealthStatus, HostError, HostHandle};

/// Binds `addr`, or says which address could not be bound and why.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, HostError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HostError::Health {
            context: format!("binding the health endpoints to {addr}"),
            source,
        })
}

/// Serves the endpoints on `listener` until the host has stopped.
pub(crate) async fn serve(listener: TcpListener, host: HostHandle) {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    tracing::info!("serving /livez, /readyz and /health on {addr}");
    let stopped = {
        let host = host.clone();
        async move {
            let _ = host.stopped().await;
        }
    };
    let app = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/health", get(health))
        .with_state(host);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stopped)
        .await
    {
        tracing::error!("the health endpoints on {addr} stopped: {e}");
    }
}

fn text(code: StatusCode, body: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn livez(State(host): State<HostHandle>) -> Response {
    let health = host.health();
    if health.live {
        text(StatusCode::OK, format!("live ({})\n", health.status))
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not live: {}\n", health.reasons.join("; ")),
        )
    }
}

async fn readyz(State(host): State<HostHandle>) -> Response {
    let health = host.health();
    if health.ready {
        text(StatusCode::OK, "ready\n".to_owned())
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {health}\n"),
        )
    }
}

async fn health(State(host): State<HostHandle>) -> Response {
    let health = host.health();
    let code = if health.status == HealthStatus::Unhealthy {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(health)).into_response()
}
