//! The alive-lock's dedicated session.

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;

use super::db_error;
use crate::coordinator::AliveLockSession;
use crate::error::Result;
use crate::types::{InstanceId, TakeAliveLockOutcome};

/// A connection of its own (never from the pool) that holds one instance's advisory lock.
/// Dropping it closes the connection, and PostgreSQL releases the lock with the session.
pub(super) struct PgAliveLock {
    conn: PgConnection,
    statement: String,
    instance: InstanceId,
    pid: Option<i32>,
}

impl PgAliveLock {
    pub(super) async fn open(
        options: PgConnectOptions,
        statement: String,
        instance: InstanceId,
    ) -> Result<TakeAliveLockOutcome> {
        let ctx = || format!("opening the alive-lock session of instance {instance}");
        let mut conn = PgConnection::connect_with(&options)
            .await
            .map_err(|e| db_error(ctx(), e))?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| db_error(ctx(), e))?;
        let mut session = PgAliveLock {
            conn,
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
        sqlx::query_scalar(&self.statement)
            .bind(self.instance.0)
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| {
                db_error(
                    format!("taking the alive-lock of instance {}", self.instance),
                    e,
                )
            })
    }

    fn session_id(&self) -> Option<i32> {
        self.pid
    }
}
