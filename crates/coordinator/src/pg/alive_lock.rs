//! The alive-lock's dedicated session.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgListener;

use super::Sessions;
use crate::coordinator::AliveLockSession;
use crate::error::Result;
use crate::types::{InstanceId, TakeAliveLockOutcome};

/// A connection of its own (never from the shared pool) that holds one instance's advisory
/// lock. It is a LISTEN connection on a channel nobody notifies, so waiting on it notices a
/// closed or broken connection at once ([`AliveLockSession::lost`]) without sending a query.
/// Dropping it closes the connection, and PostgreSQL releases the lock with the session.
/// With a multi-host URL it opens on the coordinator's current host, and its loss makes the
/// coordinator look for the host again.
pub(super) struct PgAliveLock {
    sessions: Sessions,
    listener: Option<PgListener>,
    statement: String,
    instance: InstanceId,
    pid: Option<i32>,
}

impl PgAliveLock {
    pub(super) async fn open(
        sessions: Sessions,
        session_setup: String,
        statement: String,
        channel: String,
        instance: InstanceId,
    ) -> Result<TakeAliveLockOutcome> {
        let ctx = || format!("opening the alive-lock session of instance {instance}");
        let pool = sessions.pool(Duration::from_secs(5)).await?;
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| sessions.db_error(ctx(), e))?;
        listener.ignore_pool_close_event(true);
        // A lost connection must surface as lost, not be replaced by a fresh session that
        // does not hold the lock.
        listener.eager_reconnect(false);
        // The session is idle by design: a DBA's idle_session_timeout must not end it (and
        // the lock with it).
        sqlx::query(&session_setup)
            .execute(&mut listener)
            .await
            .map_err(|e| sessions.db_error(ctx(), e))?;
        listener
            .listen(&channel)
            .await
            .map_err(|e| sessions.db_error(ctx(), e))?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut listener)
            .await
            .map_err(|e| sessions.db_error(ctx(), e))?;
        let mut session = PgAliveLock {
            sessions,
            listener: Some(listener),
            statement,
            instance,
            pid: Some(pid),
        };
        let held = session.retake().await?;
        Ok(TakeAliveLockOutcome {
            held,
            session: Box::new(session),
        })
    }
}

#[async_trait]
impl AliveLockSession for PgAliveLock {
    async fn retake(&mut self) -> Result<bool> {
        let ctx = || format!("taking the alive-lock of instance {}", self.instance);
        let Some(listener) = self.listener.as_mut() else {
            return Err(super::db_error(ctx(), sqlx::Error::PoolClosed));
        };
        let held: std::result::Result<(bool, i32), _> = sqlx::query_as(&self.statement)
            .bind(self.instance.0)
            .fetch_one(&mut *listener)
            .await;
        match held {
            Ok((held, pid)) if Some(pid) == self.pid => Ok(held),
            Ok((_, pid)) => {
                // A session lock lives in one server process; this "connection" reached
                // another one. Never trust it: drop it, and say why.
                self.listener = None;
                Err(crate::error::Error::database(
                    ctx(),
                    format!(
                        "the alive-lock session moved from server process {:?} to {pid} between \
                         two statements: the connection is not one PostgreSQL session (a pooler \
                         in transaction or statement mode, such as PgBouncer?). The alive-lock \
                         and LISTEN need a session: connect the workers directly or through \
                         session pooling (docs/store.md, \"Poolers, timeouts, keepalives and failovers\")",
                        self.pid
                    ),
                ))
            }
            Err(e) => {
                // The session is gone (and the lock with it); never reconnect silently.
                self.listener = None;
                self.sessions.lost();
                Err(self.sessions.db_error(ctx(), e))
            }
        }
    }

    async fn lost(&mut self) {
        let Some(listener) = self.listener.as_mut() else {
            return;
        };
        loop {
            match listener.try_recv().await {
                // Nobody notifies the channel; ignore anything that arrives.
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => {
                    self.listener = None;
                    self.sessions.lost();
                    return;
                }
            }
        }
    }

    fn session_id(&self) -> Option<i32> {
        self.pid
    }
}
