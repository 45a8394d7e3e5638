//! The wake listener: LISTEN on a dedicated connection, with explicit reconnects.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgListener;

use super::Sessions;
use crate::coordinator::WakeListener;
use crate::error::Result;
use crate::types::ListenEvent;

/// LISTENs on the schema's wake channel. It owns a one-connection pool of its own, so an
/// exhausted shared pool never blocks a reconnect. Any receive error drops the connection
/// and reports [`ListenEvent::Disconnected`]; the next call reconnects and reports
/// [`ListenEvent::Connected`], after which the caller polls once to catch up. With a
/// multi-host URL each connection opens on the coordinator's current host, and a disconnect
/// makes the coordinator look for the host again.
pub(super) struct PgWakeListener {
    sessions: Sessions,
    channel: String,
    /// Run on each new connection: exempts it from a DBA's idle timeouts.
    session_setup: String,
    state: State,
}

enum State {
    /// Connected, and `Connected` not reported yet.
    Fresh(PgListener),
    Listening(PgListener),
    Down,
}

impl PgWakeListener {
    pub(super) async fn open(
        sessions: Sessions,
        channel: String,
        session_setup: String,
    ) -> Result<Self> {
        let listener = connect(&sessions, &channel, &session_setup).await?;
        Ok(PgWakeListener {
            sessions,
            channel,
            session_setup,
            state: State::Fresh(listener),
        })
    }
}

async fn connect(sessions: &Sessions, channel: &str, session_setup: &str) -> Result<PgListener> {
    let ctx = || format!("listening on {channel:?}");
    let pool = sessions.pool(Duration::from_secs(3)).await?;
    let mut listener = PgListener::connect_with(&pool)
        .await
        .map_err(|e| sessions.db_error(ctx(), e))?;
    listener.ignore_pool_close_event(true);
    // A lost connection is reported at once: the next call reconnects through `sessions`
    // (on the host the coordinator uses then), so sqlx's own reconnect, to the host this
    // session was opened on, would only delay the report by up to its acquire timeout.
    listener.eager_reconnect(false);
    // The listening session is idle by design: a DBA's idle_session_timeout must not end it.
    sqlx::query(session_setup)
        .execute(&mut listener)
        .await
        .map_err(|e| sessions.db_error(ctx(), e))?;
    listener
        .listen(channel)
        .await
        .map_err(|e| sessions.db_error(ctx(), e))?;
    Ok(listener)
}

#[async_trait]
impl WakeListener for PgWakeListener {
    async fn next_event(&mut self) -> Result<ListenEvent> {
        match std::mem::replace(&mut self.state, State::Down) {
            State::Fresh(listener) => {
                self.state = State::Listening(listener);
                Ok(ListenEvent::Connected)
            }
            State::Down => {
                let listener = connect(&self.sessions, &self.channel, &self.session_setup).await?;
                self.state = State::Listening(listener);
                Ok(ListenEvent::Connected)
            }
            State::Listening(mut listener) => match listener.try_recv().await {
                Ok(Some(n)) => {
                    let queue = n.payload().to_owned();
                    self.state = State::Listening(listener);
                    Ok(ListenEvent::Wake { queue })
                }
                // Ok(None): the connection was lost; Err: the server said goodbye (e.g. a
                // terminated backend) or the socket broke. Either way start over.
                Ok(None) | Err(_) => {
                    self.sessions.lost();
                    Ok(ListenEvent::Disconnected)
                }
            },
        }
    }
}
