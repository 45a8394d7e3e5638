//! [`Transaction`]: a transaction of the caller's whose enqueues wake the claimers after it
//! commits, not in its commit.

use std::ops::{Deref, DerefMut};

use sqlx::{PgConnection, Postgres};
use workpump_coordinator::{
    EnqueueWorkOutcome, EnqueueWorkParams, Enqueued, Error, IntoWork, PendingWake, PgCoordinator,
};

use crate::context::Wake;

/// A PostgreSQL transaction for the caller's own writes and for enqueues that commit with
/// them, whose claimers are woken **after** it commits: begun by [`Client::begin`] or
/// [`Host::begin`], or wrapping a transaction of the caller's pool ([`Client::transaction`],
/// [`Host::transaction`]). It dereferences to the connection, so the caller's statements run
/// on it as on a `sqlx::Transaction` (`.execute(&mut *tx)`).
///
/// Why, against [`Client::enqueue_in`]: an enqueue in the caller's transaction that notifies
/// makes its commit take PostgreSQL's notification-queue lock and hold it through the
/// commit's WAL flush, so such transactions commit one at a time across the whole server;
/// with many producers committing at once that lock is their ceiling (docs/store.md, "Wake
/// signals"). Here the enqueue does not notify; [`commit`](Self::commit) commits, then sends
/// one wake per queue given due work, in a statement of its own (and, from a [`Host`], wakes
/// its own claim loops at once). The cost is that statement after the commit, on a connection
/// of the pool (whose check of the connection makes two round trips: the transaction's own
/// connection went back to the pool with the commit); until it
/// arrives, claimers would find the items at their next poll, and if it fails (logged) they
/// do. Dropped or [`rollback`](Self::rollback)ed, it rolls back and wakes nobody.
///
/// ```no_run
/// # use workpump_host::{Client, NewWork};
/// # async fn example(client: Client) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = client.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// tx.enqueue(NewWork::new("emails", serde_json::json!({ "order": 42 }))).await?;
/// tx.commit().await?; // commits the order and the item, then wakes the claimers
/// # Ok(())
/// # }
/// ```
///
/// [`Client::begin`]: crate::Client::begin
/// [`Client::transaction`]: crate::Client::transaction
/// [`Client::enqueue_in`]: crate::Client::enqueue_in
/// [`Host`]: crate::Host
/// [`Host::begin`]: crate::HostHandle::begin
/// [`Host::transaction`]: crate::HostHandle::transaction
pub struct Transaction<'c> {
    tx: sqlx::Transaction<'c, Postgres>,
    pg: PgCoordinator,
    pending: PendingWake,
    local: Option<Wake>,
}

impl<'c> Transaction<'c> {
    pub(crate) fn new(tx: sqlx::Transaction<'c, Postgres>, pg: PgCoordinator) -> Self {
        Transaction {
            tx,
            pg,
            pending: PendingWake::default(),
            local: None,
        }
    }

    /// Also wakes these claim loops (a host's own) at the commit.
    pub(crate) fn waking_locally(mut self, local: Option<Wake>) -> Self {
        self.local = local;
        self
    }

    /// Enqueues one item in this transaction (see [`Client::enqueue`](crate::Client::enqueue)
    /// for what it does and refuses); it commits or rolls back with the transaction.
    pub async fn enqueue(&mut self, job: impl IntoWork) -> Result<Enqueued, Error> {
        crate::client::one(self.enqueue_many([job]).await?)
    }

    /// Enqueues a batch in this transaction, in one statement, all or nothing (see
    /// [`Client::enqueue_many`](crate::Client::enqueue_many)).
    pub async fn enqueue_many<I>(&mut self, items: I) -> Result<EnqueueWorkOutcome, Error>
    where
        I: IntoIterator,
        I::Item: IntoWork,
    {
        let items = crate::client::prepare(items)?;
        let (out, pending) = self
            .pg
            .enqueue_deferring_wake(&mut self.tx, EnqueueWorkParams { items })
            .await?;
        self.pending.merge(pending);
        Ok(out)
    }

    /// Commits, then wakes the claimers of the queues its enqueues gave due work (this
    /// host's claim loops at once, the others by NOTIFY). An error is the commit's: the
    /// wake's own failure is logged (the items are committed; claimers find them at their
    /// next poll).
    pub async fn commit(self) -> Result<(), Error> {
        let Transaction {
            tx,
            pg,
            pending,
            local,
        } = self;
        pg.commit_transaction(tx).await?;
        if let Some(wake) = &local {
            for q in pending.queues() {
                wake(q);
            }
        }
        pg.wake(pending).await;
        Ok(())
    }

    /// Rolls back: the caller's writes and the enqueued items are gone, and nobody is woken.
    pub async fn rollback(self) -> Result<(), Error> {
        self.tx
            .rollback()
            .await
            .map_err(|e| Error::database("rolling back a transaction with enqueued items", e))
    }

    /// The queues its enqueues so far will wake at the commit, sorted, each once.
    pub fn queues_to_wake(&self) -> &[String] {
        self.pending.queues()
    }
}

impl Deref for Transaction<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}
