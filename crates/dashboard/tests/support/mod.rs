//! A store with work in every state, and a dashboard on it.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use workpump_coordinator::testing::{every_state, fresh_store, EveryState, FreshStore};
use workpump_coordinator::{Operations, PgCoordinator};
use workpump_dashboard::{router, Access, DashboardConfig};

pub const TOKEN: &str = "test-token-0123456789";

/// A fresh store in every state.
pub async fn store() -> (FreshStore, EveryState) {
    let fresh = fresh_store().await;
    let items = every_state(&fresh.coordinator).await;
    (fresh, items)
}

/// The dashboard on `store` with `access`.
pub fn dashboard(store: &PgCoordinator, access: Access) -> axum::Router {
    let mut config = DashboardConfig::default();
    config.access = access;
    router(Arc::new(store.clone()) as Arc<dyn Operations>, config).expect("a valid configuration")
}

/// The state of item `id`, as the database says.
pub async fn state_of(pool: &sqlx::PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT state::text FROM workpump.work_all WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read the item")
}

pub async fn paused(pool: &sqlx::PgPool, queue: &str) -> bool {
    sqlx::query_scalar("SELECT paused FROM workpump.queues WHERE name = $1")
        .bind(queue)
        .fetch_one(pool)
        .await
        .expect("read the queue")
}
