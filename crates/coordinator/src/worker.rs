//! The one contract every background worker implements, and the shape of a refused setting.
//! It lives here because every worker crate depends on this crate and on no other workpump
//! crate; the host drives any `dyn Worker` the same way.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// A background worker (claim, heartbeat, lease renewal, maintenance, or a user's own).
///
/// `run` takes `&self`, so the host restarts a worker by calling `run` again; per-run state
/// lives in locals. `run` returns only when everything it spawned has stopped. It returns
/// `Ok(())` when `shutdown` fires, and `Err` only for a state it cannot recover from (a failed
/// pass is logged, counted and retried inside the loop).
#[async_trait]
pub trait Worker: Send + Sync + 'static {
    /// A short, stable name for logs and metrics, e.g. `"claim"`.
    fn name(&self) -> &str;

    /// Runs until `shutdown` fires or an unrecoverable error.
    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError>;
}

/// Why a worker stopped on its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The store failed in a way the worker cannot work around.
    #[error("{worker}: {source}")]
    Coordinator {
        /// The worker's name.
        worker: String,
        /// The coordinator's error.
        #[source]
        source: crate::Error,
    },
    /// Anything else, with a message that says what.
    #[error("{worker}: {message}")]
    Failed {
        /// The worker's name.
        worker: String,
        /// What went wrong.
        message: String,
    },
}

/// One setting a configuration check refused: which setting, and why. Checks return every
/// problem at once, so a user fixes a config in one pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct ConfigProblem {
    /// The setting's path as written in the config, e.g. `lease.renewal_interval_ms`.
    pub setting: String,
    /// Why it was refused.
    pub reason: String,
}

impl ConfigProblem {
    /// A problem with `setting`.
    pub fn new(setting: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigProblem {
            setting: setting.into(),
            reason: reason.into(),
        }
    }
}
