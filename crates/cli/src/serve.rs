//! `workpump serve`: the web dashboard (`workpump-dashboard`) on its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use workpump_coordinator::PgCoordinator;
use workpump_dashboard::{router, Access, DashboardConfig};

use crate::failure::{ExitCode, Failure};

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on. The loopback by default: put a proxy with TLS in front to
    /// reach it from elsewhere.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// The token that logs a browser in to change things (at least 16 characters); without
    /// it the dashboard is read-only.
    #[arg(long, env = "WORKPUMP_DASHBOARD_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// Seconds between the list pages' reloads (0: never).
    #[arg(long, default_value_t = 5)]
    refresh_secs: u64,

    /// The path a proxy serves the dashboard under (e.g. /workpump); empty for the root.
    #[arg(long, default_value = "")]
    base_path: String,

    /// Mark the session cookie Secure (when a proxy serves the dashboard over HTTPS).
    #[arg(long)]
    secure_cookie: bool,
}

pub(crate) async fn serve(store: PgCoordinator, args: ServeArgs) -> Result<(), Failure> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let read_only = args.token.is_none();
    let mut config = DashboardConfig::default();
    config.access = match args.token {
        Some(token) => Access::Token(token),
        None => Access::ReadOnly,
    };
    config.base_path = args.base_path.clone();
    config.refresh = Duration::from_secs(args.refresh_secs);
    config.secure_cookie = args.secure_cookie;
    let dashboard = router(Arc::new(store), config).map_err(|e| Failure::usage(e.to_string()))?;
    let app = if args.base_path.is_empty() {
        dashboard
    } else {
        axum::Router::new().nest(&args.base_path, dashboard)
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            Failure::new(
                ExitCode::Usage,
                format!("cannot listen on {}: {e}", args.listen),
            )
            .with_hint("choose another address with --listen")
        })?;
    let address = listener
        .local_addr()
        .map_err(|e| Failure::new(ExitCode::Usage, format!("the listening address: {e}")))?;
    println!(
        "dashboard: http://{address}{} ({})",
        if args.base_path.is_empty() {
            "/"
        } else {
            &args.base_path
        },
        if read_only {
            "read-only: pass --token or set WORKPUMP_DASHBOARD_TOKEN to allow changes"
        } else {
            "changes need the token"
        }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            let terminated = async {
                match term.as_mut() {
                    Some(term) => {
                        term.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminated => {}
            }
        })
        .await
        .map_err(|e| Failure::new(ExitCode::Unreachable, format!("serving the dashboard: {e}")))
}
