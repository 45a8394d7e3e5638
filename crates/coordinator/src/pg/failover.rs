//! Following a multi-host URL's server: which host the coordinator's pools and sessions
//! connect to, checked on every connection, and moved when that host fails or stops
//! satisfying `target_session_attrs`. The mechanism is in `docs/store.md` ("Failover").

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;

use super::url::{DatabaseUrl, ServerRole, TargetSessionAttrs};
use crate::error::{Error, Result};

/// A search that found no server is not repeated sooner than this: callers that arrive
/// meanwhile get its answer, so an outage costs each host a connection attempt a few times a
/// second, not one per call.
const SEARCH_AGAIN_AFTER: Duration = Duration::from_millis(200);

/// The statement that asks a session what its server is.
const SESSION_ATTRS: &str = include_str!("../../sql/queries/session_attrs.sql");

/// The host a coordinator uses, and the search for a new one.
///
/// *Suspect* (a sqlx error that says the server is gone or read-only, a lost dedicated
/// session, a new or idle connection whose server does not satisfy the attributes, or no
/// search yet) makes the next [`Failover::ensure`] search: the current host first, then the
/// others in the order listed; the first whose server satisfies the attributes becomes
/// current, the registered pools connect there from then on, and their connections opened
/// before the move are closed instead of being handed out. When no host qualifies, the next
/// candidate becomes current all the same (another host that answered, else the next one
/// listed), and the state stays suspect: calls that pass [`Failover::ensure`] get its error,
/// and connections the pools open meanwhile are refused by their check until that host
/// qualifies — a standby being promoted is taken the moment it is.
pub(crate) struct Failover {
    url: DatabaseUrl,
    /// Index into the URL's hosts.
    current: AtomicUsize,
    /// Bumped by every sign of trouble; the state is suspect while it differs from `settled`.
    troubles: AtomicU64,
    /// The value of `troubles` when the last successful search began.
    settled: AtomicU64,
    state: Mutex<State>,
    /// One search at a time.
    searching: tokio::sync::Mutex<()>,
}

/// Why a search found no host.
struct Missing {
    /// Each host and why it does not qualify.
    reason: String,
    /// The first host other than the current one that answered.
    answered: Option<usize>,
}

struct State {
    /// Pools that follow the current host.
    pools: Vec<PgPool>,
    /// When the current host last changed: connections older than that are closed.
    moved_at: Option<Instant>,
    /// Searches finished so far.
    searches: u64,
    /// The last search, if it found nothing: when it ended and why.
    failure: Option<(Instant, String)>,
}

impl Failover {
    /// Follows `url`'s hosts, starting at the first (suspect until a search confirms it).
    pub(crate) fn new(url: DatabaseUrl) -> Arc<Failover> {
        Arc::new(Failover {
            url,
            current: AtomicUsize::new(0),
            troubles: AtomicU64::new(1),
            settled: AtomicU64::new(0),
            state: Mutex::new(State {
                pools: Vec::new(),
                moved_at: None,
                searches: 0,
                failure: None,
            }),
            searching: tokio::sync::Mutex::new(()),
        })
    }

    /// `options` with the checks that keep a pool's connections on a satisfying server:
    /// every new connection is asked what its server is, and every idle one before it is
    /// handed out (instead of sqlx's ping: one round trip either way); a connection opened
    /// before the last move is closed instead.
    pub(crate) fn pool_options(self: &Arc<Self>, options: PgPoolOptions) -> PgPoolOptions {
        let on_connect = Arc::downgrade(self);
        let on_acquire = Arc::downgrade(self);
        options
            .test_before_acquire(false)
            .after_connect(move |conn, _meta| {
                let failover = on_connect.clone();
                Box::pin(async move { admit_new(failover, conn).await })
            })
            .before_acquire(move |conn, meta| {
                let failover = on_acquire.clone();
                Box::pin(async move { Ok(admit_idle(failover, conn, meta).await) })
            })
    }

    /// A pool of `options` on the current host that follows it from now on.
    pub(crate) fn pool(self: &Arc<Self>, options: PgPoolOptions) -> PgPool {
        let mut state = self.lock();
        let pool = self
            .pool_options(options)
            .connect_lazy_with(self.current_options());
        state.pools.retain(|pool| !pool.is_closed());
        state.pools.push(pool.clone());
        pool
    }

    /// A pool of `options` on the current host that does not follow it (for one dedicated
    /// session: a new session is opened through a new pool).
    pub(crate) fn session_pool(self: &Arc<Self>, options: PgPoolOptions) -> PgPool {
        self.pool_options(options)
            .connect_lazy_with(self.current_options())
    }

    /// sqlx's options for the current host.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        self.url.host_list()[self.current.load(Ordering::Acquire)]
            .options
            .clone()
    }

    /// The current host, as `host:port`.
    pub(crate) fn current_host(&self) -> String {
        self.url.host_list()[self.current.load(Ordering::Acquire)]
            .label
            .clone()
    }

    /// Makes the next [`ensure`](Self::ensure) search.
    pub(crate) fn suspect(&self) {
        self.troubles.fetch_add(1, Ordering::AcqRel);
    }

    /// Makes the next [`ensure`](Self::ensure) search if `error` says the server is gone,
    /// refuses connections, or takes no writes.
    pub(crate) fn note(&self, error: &sqlx::Error) {
        if server_lost(error) {
            self.suspect();
        }
    }

    fn is_suspect(&self) -> bool {
        self.troubles.load(Ordering::Acquire) != self.settled.load(Ordering::Acquire)
    }

    /// Returns at once unless something made the current host suspect; then searches (one
    /// search at a time: callers that wait for a running one take its answer) and moves to
    /// the host found. An error says that no host satisfies the attributes now, and why each
    /// did not; it is transient, a later call searches again.
    pub(crate) async fn ensure(&self) -> Result<()> {
        if !self.is_suspect() {
            return Ok(());
        }
        let searches_before = self.lock().searches;
        let _turn = self.searching.lock().await;
        if !self.is_suspect() {
            return Ok(());
        }
        {
            let state = self.lock();
            if let Some((ended, reason)) = &state.failure {
                if state.searches != searches_before || ended.elapsed() < SEARCH_AGAIN_AFTER {
                    return Err(self.not_found(reason.clone()));
                }
            }
        }
        let troubles = self.troubles.load(Ordering::Acquire);
        let found = self.search().await;
        let mut state = self.lock();
        state.searches += 1;
        match found {
            Ok(index) => {
                state.failure = None;
                self.move_to(&mut state, index, true);
                // Trouble noted during the search makes the next call search again.
                self.settled.store(troubles, Ordering::Release);
                Ok(())
            }
            Err(Missing { reason, answered }) => {
                tracing::debug!(%reason, "no database host satisfies target_session_attrs");
                state.failure = Some((Instant::now(), reason.clone()));
                // Point the pools at the host likeliest to qualify soon — another host that
                // answered (a standby about to be promoted), else the next one listed — so
                // that their own connection retries, each checked, reach it once it does.
                let hosts = self.url.host_list().len();
                let current = self.current.load(Ordering::Acquire);
                let next = answered.unwrap_or((current + 1) % hosts);
                self.move_to(&mut state, next, false);
                Err(self.not_found(reason))
            }
        }
    }

    /// Makes host `index` current and points the pools at it; `qualified`: it satisfies the
    /// attributes (else it is only the likeliest to, soon).
    fn move_to(&self, state: &mut State, index: usize, qualified: bool) {
        let previous = self.current.swap(index, Ordering::AcqRel);
        if previous == index {
            return;
        }
        let hosts = self.url.host_list();
        for pool in &state.pools {
            pool.set_connect_options(hosts[index].options.clone());
        }
        state.moved_at = Some(Instant::now());
        if qualified {
            tracing::info!(
                from = %hosts[previous].label,
                to = %hosts[index].label,
                target_session_attrs = %self.url.target_session_attrs(),
                "moved to another database host"
            );
        } else {
            tracing::debug!(
                from = %hosts[previous].label,
                to = %hosts[index].label,
                "no host qualifies; pointing the pools at the next candidate"
            );
        }
    }

    /// Tries the current host, then the others in the order listed; the index of the first
    /// that satisfies the attributes (for `prefer-standby`, else the first that answered), or
    /// why none did.
    async fn search(&self) -> std::result::Result<usize, Missing> {
        let hosts = self.url.host_list();
        let attrs = self.url.target_session_attrs();
        let current = self.current.load(Ordering::Acquire);
        let order = std::iter::once(current).chain((0..hosts.len()).filter(|&i| i != current));
        let mut reasons = Vec::with_capacity(hosts.len());
        let mut fallback = None;
        let mut answered = None;
        for index in order {
            let host = &hosts[index];
            let timeout = self.url.connect_timeout();
            let conn = tokio::time::timeout(timeout, PgConnection::connect_with(&host.options));
            let mut conn = match conn.await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    reasons.push(format!("{}: {e}", host.label));
                    continue;
                }
                Err(_) => {
                    reasons.push(format!(
                        "{}: no connection within {} s (connect_timeout)",
                        host.label,
                        timeout.as_secs()
                    ));
                    continue;
                }
            };
            let role = if attrs.needs_probe() {
                role_of(&mut conn).await
            } else {
                Ok(ServerRole {
                    in_recovery: false,
                    read_only: false,
                })
            };
            let _ = conn.close().await;
            match role {
                Ok(role) if attrs.prefers(role) => return Ok(index),
                Ok(role) => {
                    if attrs.admits(role) && fallback.is_none() {
                        fallback = Some(index);
                    }
                    if index != current && answered.is_none() {
                        answered = Some(index);
                    }
                    reasons.push(format!("{}: {role}", host.label));
                }
                Err(e) => reasons.push(format!("{}: {e}", host.label)),
            }
        }
        fallback.ok_or_else(|| Missing {
            reason: reasons.join("; "),
            answered,
        })
    }

    fn not_found(&self, reason: String) -> Error {
        Error::database(
            format!(
                "finding a database host with target_session_attrs={} among {}",
                self.url.target_session_attrs(),
                self.url.hosts().join(", ")
            ),
            format!("none qualifies now: {reason}"),
        )
    }

    /// Whether a pool connection of age `age` was opened before the last move.
    fn opened_before_move(&self, age: Duration) -> bool {
        self.lock()
            .moved_at
            .is_some_and(|moved| age > moved.elapsed())
    }

    fn attrs(&self) -> TargetSessionAttrs {
        self.url.target_session_attrs()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The pool's check of a new connection: its server must satisfy the attributes. If it does
/// not, the host is suspect, a search runs (so that the pool's next attempt, which sqlx makes
/// after a short backoff, goes to the host found), and the connection is refused.
async fn admit_new(failover: Weak<Failover>, conn: &mut PgConnection) -> sqlx::Result<()> {
    let Some(failover) = failover.upgrade() else {
        return Ok(());
    };
    let attrs = failover.attrs();
    if !attrs.needs_probe() {
        return Ok(());
    }
    let refusal = match role_of(conn).await {
        Ok(role) if attrs.admits(role) => return Ok(()),
        Ok(role) => format!(
            "the server is {role}, which target_session_attrs={attrs} does not take; \
             looking for another host"
        ),
        Err(e) => {
            failover.note(&e);
            return Err(e);
        }
    };
    failover.suspect();
    let _ = failover.ensure().await;
    Err(sqlx::Error::Protocol(refusal))
}

/// The pool's check of an idle connection before it is handed out: closed if it was opened
/// before the last move, or if its server no longer answers or no longer satisfies the
/// attributes (the host is then suspect, and searched before the pool opens a new one).
async fn admit_idle(
    failover: Weak<Failover>,
    conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> bool {
    let Some(failover) = failover.upgrade() else {
        return conn.ping().await.is_ok();
    };
    if failover.opened_before_move(meta.age) {
        return false;
    }
    let attrs = failover.attrs();
    let admitted = if attrs.needs_probe() {
        role_of(conn).await.is_ok_and(|role| attrs.admits(role))
    } else {
        conn.ping().await.is_ok()
    };
    if !admitted {
        failover.suspect();
        let _ = failover.ensure().await;
    }
    admitted
}

/// What `conn`'s server is.
async fn role_of(conn: &mut PgConnection) -> sqlx::Result<ServerRole> {
    let (in_recovery, read_only): (bool, bool) =
        sqlx::query_as(SESSION_ATTRS).fetch_one(conn).await?;
    Ok(ServerRole {
        in_recovery,
        read_only,
    })
}

/// Whether `error` says the server is gone, cannot be reached, or takes no writes — the
/// errors after which another host may be the one to use.
pub(crate) fn server_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // 08: connection exception; 57P01-03: admin shutdown, crash shutdown, cannot
            // connect now (starting, stopping, in recovery); 25006: read-only transaction.
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25006")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_or_a_pool_timeout_makes_the_host_suspect_and_a_query_error_does_not() {
        let io = |kind| sqlx::Error::Io(std::io::Error::from(kind));
        assert!(server_lost(&io(std::io::ErrorKind::ConnectionRefused)));
        assert!(server_lost(&io(std::io::ErrorKind::UnexpectedEof)));
        assert!(server_lost(&sqlx::Error::PoolTimedOut));
        assert!(server_lost(&sqlx::Error::Protocol(
            "unexpected message".into()
        )));
        assert!(!server_lost(&sqlx::Error::RowNotFound));
        assert!(!server_lost(&sqlx::Error::PoolClosed));
        assert!(!server_lost(&sqlx::Error::ColumnNotFound("x".into())));
    }
}
