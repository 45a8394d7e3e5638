//! The operator's web dashboard: an axum [`Router`] over the store's [`Operations`] —
//! the queues with their depth, pickup lag, rates and paused flag; a queue; the items with
//! filters; one item with its payload, checkpoint, attempts and timeline; the instances; the
//! dead letters with bulk retry and discard; pausing and resuming queues.
//!
//! Server-rendered HTML (askama templates in `templates/`), no JavaScript: list pages
//! refresh themselves with a `<meta http-equiv="refresh">`. `workpump serve` serves it; a
//! service mounts it in its own router:
//!
//! ```no_run
//! # async fn mount(store: workpump_coordinator::PgCoordinator) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use workpump_dashboard::{router, Access, DashboardConfig};
//!
//! let mut config = DashboardConfig::default();
//! config.access = Access::Token(std::env::var("WORKPUMP_DASHBOARD_TOKEN")?);
//! config.base_path = "/workpump".to_owned();
//! let app = axum::Router::new().nest("/workpump", router(Arc::new(store), config)?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! **Access.** Pages are readable by whoever reaches the address (it binds the loopback by
//! default); every change (retry, cancel, discard, pause, resume) needs a session opened with
//! the configured token ([`Access::Token`]), or is refused outright ([`Access::ReadOnly`]).
//! Changes are `POST` forms carrying the session's CSRF token; a request whose `Origin` is
//! another site, or `Sec-Fetch-Site: cross-site`, is refused; the session cookie is
//! `HttpOnly` and `SameSite=Strict`. A bulk change shows what it will do and asks to confirm.

mod actions;
mod pages;
mod session;
mod view;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use workpump_coordinator::Operations;

use session::Sessions;

/// Who may change things through the dashboard.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Nobody: pages only, every change refused.
    ReadOnly,
    /// Whoever logs in with this token (at least 16 characters).
    Token(String),
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::ReadOnly => f.write_str("ReadOnly"),
            Access::Token(_) => f.write_str("Token(<hidden>)"),
        }
    }
}

/// How the dashboard runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DashboardConfig {
    /// Who may change things. **Default: read-only.**
    pub access: Access,
    /// The path the router is nested under (`""` at the root, or `/workpump`): the links and
    /// the cookie's path start with it, and the overview is at the path itself (`/workpump`:
    /// axum's `nest` does not route `/workpump/`). **Default: `""`.**
    pub base_path: String,
    /// How often list pages reload themselves; zero turns it off. **Default: 5 s.**
    pub refresh: Duration,
    /// Mark the session cookie `Secure` (serve it over HTTPS only). **Default: false** (the
    /// dashboard binds the loopback over plain HTTP unless a proxy fronts it).
    pub secure_cookie: bool,
    /// How long a session lasts after its login. **Default: 12 h.**
    pub session_ttl: Duration,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            access: Access::ReadOnly,
            base_path: String::new(),
            refresh: Duration::from_secs(5),
            secure_cookie: false,
            session_ttl: Duration::from_secs(12 * 60 * 60),
        }
    }
}

/// The shortest token [`Access::Token`] accepts.
pub const MIN_TOKEN_CHARS: usize = 16;

/// A configuration the dashboard refuses.
#[derive(Debug, thiserror::Error)]
#[error("dashboard: {0}")]
pub struct ConfigError(String);

impl DashboardConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Access::Token(token) = &self.access {
            if token.chars().count() < MIN_TOKEN_CHARS {
                return Err(ConfigError(format!(
                    "the access token must be at least {MIN_TOKEN_CHARS} characters, got {}",
                    token.chars().count()
                )));
            }
        }
        let base = &self.base_path;
        let base_ok = base.is_empty()
            || (base.starts_with('/')
                && !base.ends_with('/')
                && base
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b)));
        if !base_ok {
            return Err(ConfigError(format!(
                "base_path must be empty or start with / and not end with one, from A-Z a-z 0-9 / - _ . (got {base:?})"
            )));
        }
        if self.session_ttl.is_zero() {
            return Err(ConfigError("session_ttl must be more than zero".to_owned()));
        }
        Ok(())
    }
}

impl DashboardConfig {
    /// The overview's path: `/` at the root, the base path itself when nested (axum's `nest`
    /// routes `/base`, not `/base/`). Also the session cookie's path.
    pub(crate) fn home(&self) -> String {
        if self.base_path.is_empty() {
            "/".to_owned()
        } else {
            self.base_path.clone()
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) ops: Arc<dyn Operations>,
    pub(crate) config: Arc<DashboardConfig>,
    pub(crate) sessions: Arc<Sessions>,
}

/// The dashboard's routes, to serve on their own or to nest under
/// [`base_path`](DashboardConfig::base_path) in a service's router. A configuration it
/// refuses (a short token, a malformed base path) is an error naming the setting.
pub fn router(ops: Arc<dyn Operations>, config: DashboardConfig) -> Result<Router, ConfigError> {
    config.validate()?;
    let state = AppState {
        ops,
        sessions: Arc::new(Sessions::new(config.session_ttl)),
        config: Arc::new(config),
    };
    Ok(Router::new()
        .route("/", get(pages::overview))
        .route("/queues/{queue}", get(pages::queue))
        .route("/queues/{queue}/{action}", post(actions::queue_action))
        .route("/items", get(pages::items))
        .route("/items/{id}", get(pages::item))
        .route("/items/{id}/{action}", post(actions::item_action))
        .route("/instances", get(pages::instances))
        .route("/dead", get(pages::dead))
        .route("/bulk", post(actions::bulk))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .with_state(state))
}
