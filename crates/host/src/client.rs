//! [`Client`]: enqueues work and runs nothing — for producers that handle no queue.

use std::sync::Arc;

use sqlx::PgConnection;
use workpump_coordinator::{
    EnqueueWorkOutcome, EnqueueWorkParams, Enqueued, Error, IntoWork, NewWork, PgCoordinator,
    WorkCoordinator, DEFAULT_SCHEMA,
};

use crate::Transaction;

/// Enqueues work, typed ([`JobArgs`](crate::JobArgs)) or not ([`NewWork`]), alone, in bulk or
/// inside the caller's transaction — and nothing else: it registers no queue, claims nothing
/// and runs no worker, so a service that only produces (a web front end, a script) uses one
/// instead of a [`Host`](crate::Host). Its queues must exist (a host that handles them, or
/// [`HostBuilder::produces`](crate::HostBuilder::produces), or `workpump migrate` and the
/// operator's tools, registered them); an enqueue to an unknown queue fails with
/// [`Error::UnknownQueue`] and writes nothing. Cheap to clone.
///
/// ```no_run
/// use serde::{Deserialize, Serialize};
/// use workpump_host::{Client, JobArgs};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail { to: String }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::connect("postgres://app@localhost/app")?;
/// client.enqueue(SendEmail { to: "a@b.c".into() }).await?;
///
/// // In the caller's transaction: the item commits (and wakes claimers) with the order.
/// let pool = sqlx::PgPool::connect("postgres://app@localhost/app").await?;
/// let mut tx = pool.begin().await?;
/// // sqlx::query("INSERT INTO orders ...").execute(&mut *tx).await?;
/// client.enqueue_in(&mut tx, SendEmail { to: "a@b.c".into() }).await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// With the `opentelemetry` feature every enqueue records the current span's W3C trace
/// context in the item's metadata (unless it already has a `traceparent`), and the handler's
/// span continues that trace.
#[derive(Clone)]
pub struct Client {
    coordinator: Arc<dyn WorkCoordinator>,
    pg: Option<PgCoordinator>,
}

impl Client {
    /// A client of the PostgreSQL store at `url`, schema `workpump`, with a pool of up to 10
    /// connections opened on first use. For another schema or pool size, build the
    /// [`PgCoordinator`] yourself and use [`from_pg`](Self::from_pg).
    pub fn connect(url: &str) -> Result<Self, Error> {
        PgCoordinator::connect_lazy(url, DEFAULT_SCHEMA, 10).map(Self::from_pg)
    }

    /// A client of this PostgreSQL store.
    pub fn from_pg(pg: PgCoordinator) -> Self {
        Client {
            coordinator: Arc::new(pg.clone()),
            pg: Some(pg),
        }
    }

    /// A client of any coordinator (no enqueue in the caller's transaction unless it is the
    /// PostgreSQL one: use [`from_pg`](Self::from_pg)).
    pub fn new(coordinator: Arc<dyn WorkCoordinator>) -> Self {
        Client {
            coordinator,
            pg: None,
        }
    }

    /// Enqueues one item: a job's arguments with its kind's defaults, or a [`NewWork`]. When
    /// a unique key matched an unfinished item, nothing is written and its id is returned
    /// ([`Enqueued::inserted`] false).
    pub async fn enqueue(&self, job: impl IntoWork) -> Result<Enqueued, Error> {
        let outcome = self.enqueue_many([job]).await?;
        one(outcome)
    }

    /// Enqueues a batch in one statement, all or nothing (at most
    /// [`MAX_ENQUEUE_BATCH`](crate::coordinator::MAX_ENQUEUE_BATCH) items; kinds and queues
    /// may be mixed). The answer lists the items in input order.
    pub async fn enqueue_many<I>(&self, items: I) -> Result<EnqueueWorkOutcome, Error>
    where
        I: IntoIterator,
        I::Item: IntoWork,
    {
        let items = prepare(items)?;
        self.coordinator
            .enqueue_work(EnqueueWorkParams { items })
            .await
    }

    /// Enqueues one item on `conn`, typically inside the caller's transaction: it commits, or
    /// rolls back, with the caller's own writes, and claimers are woken only when it commits.
    /// Needs the PostgreSQL store.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        job: impl IntoWork,
    ) -> Result<Enqueued, Error> {
        let outcome = self.enqueue_many_in(conn, [job]).await?;
        one(outcome)
    }

    /// [`enqueue_many`](Self::enqueue_many) on `conn`, inside the caller's transaction (see
    /// [`enqueue_in`](Self::enqueue_in)).
    pub async fn enqueue_many_in<I>(
        &self,
        conn: &mut PgConnection,
        items: I,
    ) -> Result<EnqueueWorkOutcome, Error>
    where
        I: IntoIterator,
        I::Item: IntoWork,
    {
        let pg = self.pg_store()?;
        let items = prepare(items)?;
        pg.enqueue_with(conn, EnqueueWorkParams { items }).await
    }

    /// Begins a [`Transaction`] on the store's pool: the caller's writes and enqueues commit
    /// together, and the claimers are woken after the commit, not in it (so that many
    /// producers' transactions commit side by side; see [`Transaction`]). Needs the
    /// PostgreSQL store.
    pub async fn begin(&self) -> Result<Transaction<'static>, Error> {
        let pg = self.pg_store()?;
        Ok(Transaction::new(pg.begin_transaction().await?, pg.clone()))
    }

    /// Wraps a transaction of the caller's (of any pool on the store's database) as a
    /// [`Transaction`], whose enqueues wake the claimers after its
    /// [`commit`](Transaction::commit). Needs the PostgreSQL store.
    pub fn transaction<'c>(
        &self,
        tx: sqlx::Transaction<'c, sqlx::Postgres>,
    ) -> Result<Transaction<'c>, Error> {
        Ok(Transaction::new(tx, self.pg_store()?.clone()))
    }

    fn pg_store(&self) -> Result<&PgCoordinator, Error> {
        self.pg.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "enqueueing in the caller's transaction needs the PostgreSQL store; this client \
                 runs on another coordinator"
                    .into(),
            )
        })
    }

    /// The coordinator it enqueues through.
    pub fn coordinator(&self) -> Arc<dyn WorkCoordinator> {
        self.coordinator.clone()
    }

    /// The PostgreSQL store, when it is one.
    pub fn pg(&self) -> Option<&PgCoordinator> {
        self.pg.as_ref()
    }
}

/// The items to send: each converted, with the trace context attached (see [`Client`]).
pub(crate) fn prepare<I>(items: I) -> Result<Vec<NewWork>, Error>
where
    I: IntoIterator,
    I::Item: IntoWork,
{
    items
        .into_iter()
        .map(|item| item.into_work().map(crate::trace::with_trace_context))
        .collect()
}

/// The one item's answer of a one-item enqueue.
pub(crate) fn one(outcome: EnqueueWorkOutcome) -> Result<Enqueued, Error> {
    outcome
        .items
        .into_iter()
        .next()
        .ok_or_else(|| Error::database("enqueueing 1 item", "the store answered no item"))
}
