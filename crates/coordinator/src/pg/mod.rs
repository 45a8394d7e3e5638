//! [`PgCoordinator`]: the [`WorkCoordinator`] over a `PgPool`, calling the SQL functions in
//! `sql/migrations` with the statements in `sql/queries`; with a multi-host URL
//! ([`DatabaseUrl`]), on the host that satisfies its `target_session_attrs`.

mod admin;
mod alive_lock;
mod failover;
mod listener;
mod url;
mod wakes;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::migrate::Migrator;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgDatabaseError, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres, Transaction};

use crate::coordinator::{WakeListener, WorkCoordinator};
use crate::error::{Error, Result};
use crate::operations::Operations;
use crate::ops_types::*;
use crate::periodic::*;
use crate::types::*;
use crate::validate::{self, micros, sanitize_text};
use failover::Failover;

pub use admin::{grants_sql, migration_status, MigrationState, MigrationStatus};
pub use url::{DatabaseUrl, TargetSessionAttrs, DEFAULT_CONNECT_TIMEOUT};

/// The schema that holds workpump's objects unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "workpump";

/// The migrations, embedded. The crate's `sql` is a symbolic link to the workspace's `sql/`, so
/// the paths here and in `include_str!` stay inside the crate and `cargo package` ships the files.
///
/// `ignore_missing`: a migration applied by a newer release is not an error. During a rolling
/// upgrade an instance of the previous release may (re)start after the new one migrated; its
/// `migrate` must find nothing to do rather than refuse (docs/upgrading.md). A changed
/// migration is still refused.
static MIGRATOR: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("sql/migrations")
};

/// How long [`migrate`] waits for the migration lock. **60 s.**
pub const DEFAULT_MIGRATE_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// How [`migrate_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrateOptions {
    /// How long to wait for the schema's migration lock (a session advisory lock that
    /// migrators of one schema take turns on) before giving up with
    /// [`Error::MigrationLocked`], which names the session holding it. **Default: 60 s.**
    pub lock_timeout: Duration,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            lock_timeout: DEFAULT_MIGRATE_LOCK_TIMEOUT,
        }
    }
}

/// Applies workpump's migrations to `schema` (created if missing), waiting at most
/// [`DEFAULT_MIGRATE_LOCK_TIMEOUT`] for the migration lock; see [`migrate_with`].
pub async fn migrate(pool: &PgPool, schema: &str) -> Result<()> {
    migrate_with(pool, schema, MigrateOptions::default()).await
}

/// Applies workpump's migrations to `schema` (created if missing). Running it again is a
/// no-op; several processes may run it at once (they take turns on an advisory lock, waiting
/// at most `options.lock_timeout` for it: then [`Error::MigrationLocked`] names the session
/// that holds it, and nothing was migrated). It uses a dedicated connection with the pool's
/// options, so the pool's connections never see the migration's `search_path` or lock
/// timeout.
pub async fn migrate_with(pool: &PgPool, schema: &str, options: MigrateOptions) -> Result<()> {
    validate::validate_schema_name(schema)?;
    if options.lock_timeout.as_millis() == 0 || options.lock_timeout > MAX_MIGRATE_LOCK_TIMEOUT {
        return Err(Error::InvalidArgument(format!(
            "migrate: lock_timeout must be between 1 ms and 24 h, got {:?}",
            options.lock_timeout
        )));
    }
    let stmts = Statements::new(schema);
    let ctx = || format!("migrating schema {schema:?}");
    let options_pg: PgConnectOptions = (*pool.connect_options()).clone();
    let mut conn = PgConnection::connect_with(&options_pg)
        .await
        .map_err(|e| db_error(ctx(), e))?;
    let result = async {
        sqlx::query(&stmts.migrate_lock_timeout)
            .bind(options.lock_timeout.as_millis().to_string())
            .execute(&mut conn)
            .await
            .map_err(|e| db_error(ctx(), e))?;
        if let Err(e) = sqlx::query(&stmts.migrate_lock)
            .bind(schema)
            .execute(&mut conn)
            .await
        {
            if sqlstate(&e).as_deref() != Some(LOCK_NOT_AVAILABLE) {
                return Err(db_error(ctx(), e));
            }
            let holder = sqlx::query_as::<_, HolderRow>(&stmts.migrate_lock_holder)
                .bind(schema)
                .fetch_optional(&mut conn)
                .await
                .map_err(|e| db_error(ctx(), e))?;
            return Err(Error::MigrationLocked {
                schema: schema.to_owned(),
                waited: options.lock_timeout,
                holder: holder.map(|h| Box::new(h.into_holder())),
            });
        }
        let migrated = async {
            sqlx::query(&stmts.migrate_lock_timeout_reset)
                .execute(&mut conn)
                .await?;
            let exists: bool = sqlx::query_scalar(&stmts.migrate_schema_exists)
                .bind(schema)
                .fetch_one(&mut conn)
                .await?;
            if !exists {
                sqlx::query(&stmts.migrate_create_schema)
                    .execute(&mut conn)
                    .await?;
            }
            sqlx::query(&stmts.migrate_search_path)
                .execute(&mut conn)
                .await?;
            MIGRATOR.run_direct(&mut conn).await?;
            sqlx::query(&stmts.migrate_unlock)
                .bind(schema)
                .execute(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>(())
        }
        .await;
        migrated.map_err(|e| db_error(ctx(), e))
    }
    .await;
    // Closing the session drops its lock, its search_path and its lock timeout, whatever
    // happened above.
    let _ = conn.close().await;
    result
}

/// The longest [`MigrateOptions::lock_timeout`] accepted.
const MAX_MIGRATE_LOCK_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// SQLSTATE 55P03: a lock wait outlived `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

#[derive(sqlx::FromRow)]
struct HolderRow {
    pid: i32,
    usename: Option<String>,
    application_name: Option<String>,
    client_addr: Option<String>,
    backend_start: Option<DateTime<Utc>>,
    state: Option<String>,
    state_change: Option<DateTime<Utc>>,
}

impl HolderRow {
    fn into_holder(self) -> crate::LockHolder {
        crate::LockHolder {
            pid: self.pid,
            user: self.usename,
            application_name: self.application_name,
            client_addr: self.client_addr,
            connected_since: self.backend_start,
            state: self.state,
            state_since: self.state_change,
        }
    }
}

/// The statements of `sql/queries`, with the schema filled in (validated and quoted).
struct Statements {
    claim_work: String,
    renew_leases: String,
    complete_work: String,
    fail_work: String,
    release_work: String,
    checkpoint_work: String,
    enqueue_work: String,
    wake_queues: String,
    register_queue: String,
    record_heartbeat: String,
    cleanup_stale_instances: String,
    deregister_instance: String,
    take_alive_lock: String,
    is_instance_alive: String,
    lock_lease: String,
    promote_scheduled: String,
    dead_letter_expired: String,
    prune_finished: String,
    prune_evicted_instances: String,
    maintenance_due: String,
    queue_depth: String,
    server_status: String,
    dedicated_session: String,
    cancel_work: String,
    retry_dead_work: String,
    discard_work: String,
    list_work: String,
    get_work: String,
    queue_overview: String,
    list_instances: String,
    pause_queue: String,
    resume_queue: String,
    bulk_work: String,
    bulk_work_matching: String,
    set_queue_settings: String,
    fire_periodic: String,
    ordering_repair: String,
    work_vacuum_due: String,
    vacuum_work: String,
    list_held_keys: String,
    migrate_lock: String,
    migrate_lock_timeout: String,
    migrate_lock_timeout_reset: String,
    migrate_lock_holder: String,
    migrate_unlock: String,
    migrate_create_schema: String,
    migrate_schema_exists: String,
    migrate_search_path: String,
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../../sql/queries/", $name, ".sql"))
    };
}

impl Statements {
    fn new(schema: &str) -> Self {
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let s = |text: &str| text.replace("{schema}", &quoted);
        Statements {
            claim_work: s(query_file!("claim_work")),
            renew_leases: s(query_file!("renew_leases")),
            complete_work: s(query_file!("complete_work")),
            fail_work: s(query_file!("fail_work")),
            release_work: s(query_file!("release_work")),
            checkpoint_work: s(query_file!("checkpoint_work")),
            enqueue_work: s(query_file!("enqueue_work")),
            wake_queues: s(query_file!("wake_queues")),
            register_queue: s(query_file!("register_queue")),
            record_heartbeat: s(query_file!("record_heartbeat")),
            cleanup_stale_instances: s(query_file!("cleanup_stale_instances")),
            deregister_instance: s(query_file!("deregister_instance")),
            take_alive_lock: s(query_file!("take_alive_lock")),
            is_instance_alive: s(query_file!("is_instance_alive")),
            lock_lease: s(query_file!("lock_lease")),
            promote_scheduled: s(query_file!("promote_scheduled")),
            dead_letter_expired: s(query_file!("dead_letter_expired")),
            prune_finished: s(query_file!("prune_finished")),
            prune_evicted_instances: s(query_file!("prune_evicted_instances")),
            maintenance_due: s(query_file!("maintenance_due")),
            queue_depth: s(query_file!("queue_depth")),
            server_status: s(query_file!("server_status")),
            dedicated_session: s(query_file!("dedicated_session")),
            cancel_work: s(query_file!("cancel_work")),
            retry_dead_work: s(query_file!("retry_dead_work")),
            discard_work: s(query_file!("discard_work")),
            list_work: s(query_file!("list_work")),
            get_work: s(query_file!("get_work")),
            queue_overview: s(query_file!("queue_overview")),
            list_instances: s(query_file!("list_instances")),
            pause_queue: s(query_file!("pause_queue")),
            resume_queue: s(query_file!("resume_queue")),
            bulk_work: s(query_file!("bulk_work")),
            bulk_work_matching: s(query_file!("bulk_work_matching")),
            set_queue_settings: s(query_file!("set_queue_settings")),
            fire_periodic: s(query_file!("fire_periodic")),
            ordering_repair: s(query_file!("ordering_repair")),
            work_vacuum_due: s(query_file!("work_vacuum_due")),
            vacuum_work: s(query_file!("vacuum_work")),
            list_held_keys: s(query_file!("list_held_keys")),
            migrate_lock: s(query_file!("migrate_lock")),
            migrate_lock_timeout: s(query_file!("migrate_lock_timeout")),
            migrate_lock_timeout_reset: s(query_file!("migrate_lock_timeout_reset")),
            migrate_lock_holder: s(query_file!("migrate_lock_holder")),
            migrate_unlock: s(query_file!("migrate_unlock")),
            migrate_create_schema: s(query_file!("migrate_create_schema")),
            migrate_schema_exists: s(query_file!("migrate_schema_exists")),
            migrate_search_path: s(query_file!("migrate_search_path")),
        }
    }
}

/// The [`WorkCoordinator`] over PostgreSQL. Cheap to clone (the pool and the statements are
/// shared).
///
/// Two pools: the *pool* it was made with, where handlers' fenced transactions, enqueues and
/// migrations run; and the *control* pool, where every other [`WorkCoordinator`] call runs
/// (claims, renewals, heartbeats, outcomes, sweeps). They are
/// the same pool unless [`with_control_pool`](Self::with_control_pool) gives it one of its own
/// — which the host does, so handlers that hold their connections for a long time can starve
/// neither renewals nor heartbeats. The alive-lock and the wake listener each get a dedicated
/// connection made with the pool's options, outside both pools.
///
/// **Failover.** Made by [`connect_lazy`](Self::connect_lazy) with a multi-host URL (see
/// [`DatabaseUrl`]), e.g.
/// `postgres://app@10.0.0.1:5432,10.0.0.2:5432/app?target_session_attrs=read-write`, the
/// coordinator settles on the first host whose server satisfies `target_session_attrs` —
/// the host it is on first, then the others in the order listed — and moves when that host
/// fails or stops satisfying it (a crashed primary, a promoted standby elsewhere, a server
/// turned read-only): every new connection of its pools and dedicated sessions is asked what
/// its server is, and so is every idle one before reuse; a call that fails because the server
/// is gone, refuses connections or takes no writes makes the next call look for the host
/// again before it runs; connections opened before a move are closed instead of reused. No
/// call is retried: the one that met the failure returns its error, and the callers' own
/// retries (every worker has them) reach the new host. The pools that follow the host are
/// the main pool and those of [`dedicated_pool`](Self::dedicated_pool); a pool given to
/// [`with_control_pool`](Self::with_control_pool) stays where its owner pointed it.
/// `docs/store.md` ("Failover") has the details.
#[derive(Clone)]
pub struct PgCoordinator {
    pool: PgPool,
    control: PgPool,
    schema: Arc<str>,
    stmts: Arc<Statements>,
    /// With a multi-host URL: the host in use, and the search for another.
    failover: Option<Arc<Failover>>,
    /// The producers' wakes, coalesced (see [`wakes`]).
    wakes: Arc<wakes::Wakes>,
}

impl std::fmt::Debug for PgCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCoordinator")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PgCoordinator {
    /// A coordinator on `pool` for the default schema (`workpump`).
    pub fn new(pool: PgPool) -> Self {
        Self::with_schema(pool, DEFAULT_SCHEMA).expect("the default schema name is valid")
    }

    /// A coordinator on `pool` for `schema` (see [`crate::validate_schema_name`]).
    pub fn with_schema(pool: PgPool, schema: &str) -> Result<Self> {
        validate::validate_schema_name(schema)?;
        Ok(PgCoordinator {
            control: pool.clone(),
            pool,
            schema: schema.into(),
            stmts: Arc::new(Statements::new(schema)),
            failover: None,
            wakes: Arc::default(),
        })
    }

    /// Runs every [`WorkCoordinator`] call on `control` instead of the main pool.
    pub fn with_control_pool(mut self, control: PgPool) -> Self {
        self.control = control;
        self
    }

    /// A lazily connected pool of at most `max_connections`, with the main pool's connect
    /// options: a control pool for [`with_control_pool`](Self::with_control_pool). With a
    /// multi-host URL it follows the coordinator's host, as the main pool does.
    pub fn dedicated_pool(&self, max_connections: u32) -> PgPool {
        let options = PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10));
        match &self.failover {
            Some(failover) => failover.pool(options),
            None => options.connect_lazy_with((*self.pool.connect_options()).clone()),
        }
    }

    /// Connects a pool of at most `max_connections` to `url` and returns a coordinator on it
    /// for `schema`. Connecting is lazy: an unreachable database shows up on the first call.
    ///
    /// `url` is read as libpq reads it ([`DatabaseUrl`]): with several hosts, or a
    /// `target_session_attrs`, the coordinator follows the host that satisfies it (see
    /// *Failover* above). A malformed URL is an [`Error::InvalidArgument`] naming the problem.
    pub fn connect_lazy(url: &str, schema: &str, max_connections: u32) -> Result<Self> {
        let url = DatabaseUrl::parse(url)?;
        let options = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10));
        if !url.needs_failover() {
            let pool = options.connect_lazy_with(url.host_list()[0].options.clone());
            return Self::with_schema(pool, schema);
        }
        let failover = Failover::new(url);
        let mut coordinator = Self::with_schema(failover.pool(options), schema)?;
        coordinator.failover = Some(failover);
        Ok(coordinator)
    }

    /// With a multi-host URL, the host the coordinator uses now (`host:port`); `None` for a
    /// coordinator made on a pool.
    pub fn current_host(&self) -> Option<String> {
        self.failover
            .as_ref()
            .map(|failover| failover.current_host())
    }

    /// The main pool (fenced transactions, migrations).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The pool the [`WorkCoordinator`] calls run on.
    pub fn control_pool(&self) -> &PgPool {
        &self.control
    }

    /// The schema this coordinator works in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The NOTIFY channel that wakes claimers of this schema (payload: the queue name).
    pub fn wake_channel(&self) -> String {
        format!("{}.wake", self.schema)
    }

    /// Applies the migrations to this coordinator's schema; see [`migrate`].
    pub async fn migrate(&self) -> Result<()> {
        self.route().await?;
        let migrated = migrate(&self.pool, &self.schema).await;
        if let (Err(Error::Database { source, .. }), Some(failover)) = (&migrated, &self.failover) {
            if let Some(e) = source.downcast_ref::<sqlx::Error>() {
                failover.note(e);
            }
        }
        migrated
    }

    /// Applies the migrations to this coordinator's schema with `options`; see
    /// [`migrate_with`].
    pub async fn migrate_with(&self, options: MigrateOptions) -> Result<()> {
        migrate_with(&self.pool, &self.schema, options).await
    }

    /// Enqueues on the caller's connection, typically inside the caller's transaction, so the
    /// work commits or rolls back with the caller's own writes. Wake signals go out when (and
    /// only if) that transaction commits, once per queue.
    pub async fn enqueue_with(
        &self,
        conn: &mut PgConnection,
        params: EnqueueWorkParams,
    ) -> Result<EnqueueWorkOutcome> {
        self.enqueue_on(conn, params, true).await
    }

    /// [`enqueue_with`](Self::enqueue_with) without the wake in the caller's commit: the
    /// answer comes with the wake signals owed, which [`wake`](Self::wake) sends once the
    /// caller's transaction has committed (and nobody sends when it rolls back). A notifying
    /// commit holds PostgreSQL's notification-queue lock through its WAL flush, so callers'
    /// transactions that notify commit one at a time; these commit side by side, and the
    /// wake costs a statement after the commit on a connection of the pool (with the pool's
    /// check of the connection, two round trips; docs/store.md, "Wake signals").
    /// Until the wake, claimers find the items at their next poll.
    pub async fn enqueue_deferring_wake(
        &self,
        conn: &mut PgConnection,
        params: EnqueueWorkParams,
    ) -> Result<(EnqueueWorkOutcome, PendingWake)> {
        let queues = due_queues(&params);
        let out = self.enqueue_on(conn, params, false).await?;
        Ok((out, PendingWake { queues }))
    }

    /// A transaction on the main pool, on the server the URL routes to now, for a producer's
    /// own writes and [`enqueue_deferring_wake`](Self::enqueue_deferring_wake).
    pub async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.begin(|| "beginning a transaction".to_string()).await
    }

    /// Commits `tx`, mapping a failure as the store's other calls do (a server gone or read
    /// only is noted for the failover watch).
    pub async fn commit_transaction(
        &self,
        tx: sqlx::Transaction<'_, sqlx::Postgres>,
    ) -> Result<()> {
        tx.commit()
            .await
            .map_err(|e| self.db_error("committing a transaction with enqueued items", e))
    }

    /// Sends the wake signals of items enqueued by
    /// [`enqueue_deferring_wake`](Self::enqueue_deferring_wake) in a transaction that has
    /// committed: one notification per queue given work that is due, in a transaction of its
    /// own on the main pool whose commit does not wait for its WAL flush. Shared with this
    /// coordinator's other producers: while another's wake is in flight, this one waits for
    /// the next, which carries the queues of every producer waiting (docs/store.md, "Wake
    /// signals"); it returns once a wake that started after the call has been sent. A failure
    /// is logged, not returned: the items are committed, and claimers find them at their next
    /// poll.
    pub async fn wake(&self, pending: PendingWake) {
        self.wakes
            .wake(&pending.queues, (), |_, queues| async move {
                if let Err(e) = self.send_wake(None, &queues).await {
                    tracing::warn!(
                        "waking the claimers of {queues:?} after a transaction's enqueue \
                         failed; they find the items at their next poll: {e}"
                    );
                }
            })
            .await;
    }

    /// The wake statement (`sql/queries/wake_queues.sql`) for `queues`, on `conn` or else on
    /// the main pool.
    async fn send_wake(
        &self,
        conn: Option<sqlx::pool::PoolConnection<Postgres>>,
        queues: &[String],
    ) -> sqlx::Result<()> {
        let query = sqlx::query(&self.stmts.wake_queues)
            .bind(self.wake_channel())
            .bind(queues);
        match conn {
            Some(mut conn) => query.execute(&mut *conn).await,
            None => query.execute(&self.pool).await,
        }
        .map(drop)
    }

    /// `enqueue_work` on `conn`; `notify`: whether the statement's transaction sends the wake
    /// signals itself (at its commit).
    async fn enqueue_on(
        &self,
        conn: &mut PgConnection,
        params: EnqueueWorkParams,
        notify: bool,
    ) -> Result<EnqueueWorkOutcome> {
        let texts = validate::validate_enqueue(&params)?;
        let n = params.items.len();
        let mut kinds = Vec::with_capacity(n);
        let mut queues = Vec::with_capacity(n);
        let mut priorities = Vec::with_capacity(n);
        let mut run_after: Vec<Option<PgInterval>> = Vec::with_capacity(n);
        let mut run_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(n);
        let mut unique_keys = Vec::with_capacity(n);
        let mut max_attempts = Vec::with_capacity(n);
        let mut ordering_keys = Vec::with_capacity(n);
        for item in params.items {
            queues.push(item.queue);
            priorities.push(item.priority);
            let (after, at) = match item.schedule {
                Schedule::Now => (None, None),
                Schedule::After(d) => (Some(interval(d)), None),
                Schedule::At(t) => (None, Some(t)),
            };
            run_after.push(after);
            run_at.push(at);
            unique_keys.push(item.unique_key);
            max_attempts.push(item.max_attempts);
            kinds.push(item.kind);
            ordering_keys.push(item.ordering_key);
        }
        let rows: Vec<(i32, Option<i64>, bool)> = sqlx::query_as(&self.stmts.enqueue_work)
            .bind(&queues)
            .bind(&texts.payloads)
            .bind(&priorities)
            .bind(&run_after)
            .bind(&run_at)
            .bind(&unique_keys)
            .bind(&max_attempts)
            .bind(&kinds)
            .bind(&texts.metadata)
            .bind(&ordering_keys)
            .bind(notify)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.db_error(format!("enqueueing {n} items"), e))?;
        let mut items = Vec::with_capacity(rows.len());
        for (ord, id, inserted) in rows {
            // enqueue_work answers every item with an id, or fails whole; a NULL here
            // is a store that does not keep that promise.
            let id = id.ok_or_else(|| {
                Error::database(
                    format!("enqueueing {n} items"),
                    format!("enqueue_work returned no id for item {}", ord - 1),
                )
            })?;
            items.push(Enqueued { id, inserted });
        }
        Ok(EnqueueWorkOutcome { items })
    }

    /// A transaction on the main pool, on the server the URL routes to now; `ctx` names what
    /// it is for in the error.
    async fn begin(
        &self,
        ctx: impl Fn() -> String,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.route().await?;
        self.pool.begin().await.map_err(|e| self.db_error(ctx(), e))
    }

    /// Begins a transaction whose first statement verifies and locks the claim's lease. The
    /// handler's business writes on [`FencedTransaction::connection`] and the item's
    /// completion ([`FencedTransaction::complete`]) then commit together, or not at all:
    /// when the lease was already lost this returns [`Error::FencedOut`] and nothing happens.
    pub async fn begin_fenced(
        &self,
        instance: InstanceId,
        fence: Fence,
    ) -> Result<FencedTransaction> {
        let ctx = || format!("locking the lease of item {}", fence.id);
        let mut tx = self.begin(ctx).await?;
        let locked: bool = sqlx::query_scalar(&self.stmts.lock_lease)
            .bind(instance.0)
            .bind(fence.id)
            .bind(fence.token)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        if !locked {
            let _ = tx.rollback().await;
            return Err(Error::FencedOut { id: fence.id });
        }
        Ok(FencedTransaction {
            tx,
            instance,
            fence,
            stmts: self.stmts.clone(),
            failover: self.failover.clone(),
        })
    }

    /// With a multi-host URL: when the current host is suspect, finds the one to use first.
    async fn route(&self) -> Result<()> {
        match &self.failover {
            Some(failover) => failover.ensure().await,
            None => Ok(()),
        }
    }

    /// The control pool, on the right host.
    async fn control(&self) -> Result<&PgPool> {
        self.route().await?;
        Ok(&self.control)
    }

    /// [`db_error`], after noting an error that says the server is gone or read-only.
    fn db_error(&self, context: impl Into<String>, e: sqlx::Error) -> Error {
        noted(self.failover.as_deref(), context, e)
    }

    /// Where the dedicated sessions connect.
    fn sessions(&self) -> Sessions {
        Sessions {
            pool: self.pool.clone(),
            failover: self.failover.clone(),
        }
    }

    async fn outcome_rows(
        &self,
        ctx: String,
        query: sqlx::query::QueryAs<
            '_,
            Postgres,
            (i64, i64, Option<String>),
            sqlx::postgres::PgArguments,
        >,
    ) -> Result<OutcomeBatch> {
        let rows = query
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx.clone(), e))?;
        rows.into_iter()
            .map(|(id, token, state)| {
                let state = match state {
                    None => None,
                    Some(s) => Some(parse_state(&s, &ctx)?),
                };
                Ok(OutcomeRecord {
                    fence: Fence { id, token },
                    state,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(|items| OutcomeBatch {
                items,
                handed_off: Vec::new(),
            })
    }
}

/// A transaction that holds an item's lease locked; see [`PgCoordinator::begin_fenced`].
/// Dropping it without [`complete`](Self::complete) rolls everything back.
pub struct FencedTransaction {
    tx: Transaction<'static, Postgres>,
    instance: InstanceId,
    fence: Fence,
    stmts: Arc<Statements>,
    failover: Option<Arc<Failover>>,
}

impl std::fmt::Debug for FencedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl FencedTransaction {
    /// The connection for the handler's business writes, inside the transaction.
    pub fn connection(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// The claim this transaction is fenced on.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Records the item as completed and commits the business writes with it.
    pub async fn complete(mut self) -> Result<()> {
        let id = self.fence.id;
        let ctx = || format!("completing item {id} in its fenced transaction");
        let recorded: CompleteRow = sqlx::query_as(&self.stmts.complete_work)
            .bind(self.instance.0)
            .bind(vec![id])
            .bind(vec![self.fence.token])
            .bind(None::<Vec<String>>)
            .bind(None::<Vec<PgInterval>>)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(|e| self.fail(ctx(), e))?;
        if !recorded.recorded {
            // Impossible while the row is locked, but never commit an unfenced outcome.
            let _ = self.tx.rollback().await;
            return Err(Error::FencedOut { id });
        }
        let failover = self.failover.clone();
        self.tx
            .commit()
            .await
            .map_err(|e| noted(failover.as_deref(), ctx(), e))
    }

    /// [`db_error`], after noting an error that says the server is gone or read-only.
    fn fail(&self, context: impl Into<String>, e: sqlx::Error) -> Error {
        noted(self.failover.as_deref(), context, e)
    }

    /// Rolls back the business writes; the item stays leased to the claim.
    pub async fn rollback(self) -> Result<()> {
        let id = self.fence.id;
        let failover = self.failover.clone();
        self.tx.rollback().await.map_err(|e| {
            noted(
                failover.as_deref(),
                format!("rolling back the fenced transaction of item {id}"),
                e,
            )
        })
    }
}

#[async_trait]
impl WorkCoordinator for PgCoordinator {
    async fn register_queue(&self, params: RegisterQueueParams) -> Result<RegisterQueueOutcome> {
        validate::validate_register_queue(&params)?;
        let ctx = || format!("registering queue {:?}", params.name);
        let row: SettingsRow = sqlx::query_as(&self.stmts.register_queue)
            .bind(&params.name)
            .bind(params.max_attempts)
            .bind(params.owner.as_deref())
            .bind(params.ordering_dead_head.as_str())
            .bind(params.max_running.map(|n| n as i32))
            .bind(params.rate_limit.map(|r| r.limit as i32))
            .bind(params.rate_limit.map(|r| interval(r.period)))
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        Ok(RegisterQueueOutcome {
            applied: row.applied.unwrap_or(true),
            owner: row.owner,
            max_attempts: row.max_attempts,
            ordering_dead_head: OrderingDeadHead::parse(&row.ordering_dead_head)
                .map_err(|e| Error::database(ctx(), e.to_string()))?,
            max_running: row.max_running.map(|n| n.max(0) as u32),
            rate_limit: rate_limit(row.rate_limit, row.rate_period),
        })
    }

    async fn enqueue_work(&self, params: EnqueueWorkParams) -> Result<EnqueueWorkOutcome> {
        let n = params.items.len();
        self.route().await?;
        // Producers' traffic: the main pool, not the workers' control pool.
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| self.db_error(format!("enqueueing {n} items"), e))?;
        // The statement is a transaction of its own: it commits without notifying (a
        // notifying commit holds PostgreSQL's notification-queue lock through its WAL flush,
        // so notifying producers commit one at a time), and the wake goes out after the
        // commit, before this returns, shared with the coordinator's other producers
        // (docs/store.md, "Wake signals").
        let wake = due_queues(&params);
        let out = self.enqueue_on(&mut conn, params, false).await?;
        self.wakes
            .wake(&wake, conn, |conn, queues| async move {
                // On the enqueue's connection, unless this producer waited for another's
                // wake first (and gave it back to the pool meanwhile).
                if let Err(e) = self.send_wake(conn, &queues).await {
                    // The items are committed: an error here would have the caller enqueue
                    // them again. Claimers find them at their next poll instead.
                    tracing::warn!(
                        "enqueued {n} items, but waking the claimers of {queues:?} failed; they \
                         find the items at their next poll: {e}"
                    );
                }
            })
            .await;
        Ok(out)
    }

    async fn claim_work(&self, params: ClaimWorkParams) -> Result<ClaimWorkOutcome> {
        validate::validate_claim(&params)?;
        let rows: Vec<ClaimRow> = sqlx::query_as(&self.stmts.claim_work)
            .bind(params.instance.0)
            .bind(&params.queues)
            .bind(params.max_items as i32)
            .bind(interval(params.lease))
            .bind(params.async_commit)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| match sqlstate(&e).as_deref() {
                Some("WP003") => Error::NotRegistered(params.instance),
                _ => self.db_error(format!("claiming up to {} items", params.max_items), e),
            })?;
        let has_more = rows.iter().any(|r| r.has_more);
        let ctx = || format!("claiming up to {} items", params.max_items);
        let mut items = Vec::with_capacity(rows.len());
        let mut throttles = Vec::new();
        let mut orphans_ended = DeadLetterExpiredOutcome::default();
        for r in rows {
            // A status row (id NULL) says what the claim ended, or that a queue was
            // throttled; the others are items.
            if let Some(state) = r.ended.as_deref() {
                let items = r.ended_items.unwrap_or_default();
                add_ended(&mut orphans_ended, r.queue, state, items, &ctx())?;
                continue;
            }
            let (Some(id), Some(claim_token), Some(priority), Some(attempt)) =
                (r.id, r.claim_token, r.priority, r.attempt)
            else {
                let reason = r.throttle.as_deref().unwrap_or_default();
                throttles.push(Throttle {
                    queue: r.queue,
                    reason: ThrottleReason::parse(reason)
                        .map_err(|e| Error::database(ctx(), e.to_string()))?,
                    retry_after: r.throttle_wait.map(seconds),
                });
                continue;
            };
            let missing = |what: &str| Error::database(ctx(), format!("item {id} without {what}"));
            items.push(ClaimedWork {
                fence: Fence {
                    id,
                    token: claim_token,
                },
                queue: r.queue,
                kind: r.kind,
                payload: r.payload.ok_or_else(|| missing("payload"))?,
                metadata: r.metadata,
                priority,
                attempt,
                max_attempts: r.max_attempts.ok_or_else(|| missing("max_attempts"))?,
                checkpoint: r.checkpoint,
                lease_expiry: r.lease_expiry.ok_or_else(|| missing("lease_expiry"))?,
                created_at: r.created_at.ok_or_else(|| missing("created_at"))?,
                reclaimed: r.reclaimed.unwrap_or(false),
                pickup_lag: r.pickup_lag.map(seconds),
            });
        }
        Ok(ClaimWorkOutcome {
            items,
            has_more,
            throttles,
            orphans_ended,
        })
    }

    async fn renew_leases(&self, params: RenewLeasesParams) -> Result<RenewLeasesOutcome> {
        validate::validate_renew(&params)?;
        if params.leases.is_empty() {
            return Ok(RenewLeasesOutcome::default());
        }
        // renew_leases answers each distinct pair once, in the order of its first request.
        let (ids, tokens) = split_fences(&params.leases);
        let ctx = || format!("renewing {} leases", params.leases.len());
        let rows: Vec<(i64, i64, String, bool)> = sqlx::query_as(&self.stmts.renew_leases)
            .bind(params.instance.0)
            .bind(&ids)
            .bind(&tokens)
            .bind(interval(params.lease))
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let items = rows
            .into_iter()
            .map(|(id, token, status, cancel_requested)| {
                let status = match status.as_str() {
                    "renewed" => RenewalStatus::Renewed,
                    "lost" => RenewalStatus::Lost,
                    "busy" => RenewalStatus::Busy,
                    "evicted" => RenewalStatus::Evicted,
                    other => {
                        return Err(Error::database(
                            ctx(),
                            format!("unknown renewal status {other:?}"),
                        ))
                    }
                };
                Ok(Renewal {
                    fence: Fence { id, token },
                    status,
                    cancel_requested,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RenewLeasesOutcome { items })
    }

    async fn complete_work(&self, params: CompleteWorkParams) -> Result<CompleteWorkOutcome> {
        if params.items.is_empty() {
            return Ok(OutcomeBatch::default());
        }
        let (ids, tokens) = split_fences(&params.items);
        let (queues, leases): (Vec<&str>, Vec<PgInterval>) = params
            .hand_off
            .iter()
            .map(|h| (h.queue.as_str(), interval(h.lease)))
            .unzip();
        let ctx = || format!("completing {} items", ids.len());
        let rows: Vec<CompleteRow> = sqlx::query_as(&self.stmts.complete_work)
            .bind(params.instance.0)
            .bind(&ids)
            .bind(&tokens)
            .bind(&queues)
            .bind(&leases)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let mut batch = OutcomeBatch::default();
        for mut r in rows {
            let fence = Fence {
                id: r.id,
                token: r.claim_token,
            };
            batch.items.push(OutcomeRecord {
                fence,
                state: r.recorded.then_some(WorkState::Completed),
            });
            if let Some(item) = r.next(&ctx)? {
                batch.handed_off.push(HandedOff { after: fence, item });
            }
        }
        Ok(batch)
    }

    async fn fail_work(&self, params: FailWorkParams) -> Result<FailWorkOutcome> {
        validate::validate_fail(&params)?;
        if params.items.is_empty() {
            return Ok(OutcomeBatch::default());
        }
        let n = params.items.len();
        let mut ids = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut retry_after: Vec<Option<PgInterval>> = Vec::with_capacity(n);
        let mut cancelled = Vec::with_capacity(n);
        for f in &params.items {
            ids.push(f.fence.id);
            tokens.push(f.fence.token);
            errors.push(sanitize_text(&f.error));
            let (retry, cancel) = match f.disposition {
                FailDisposition::RetryAfter(d) => (Some(interval(d)), false),
                FailDisposition::DeadLetter => (None, false),
                FailDisposition::Cancelled => (None, true),
            };
            retry_after.push(retry);
            cancelled.push(cancel);
        }
        let query = sqlx::query_as(&self.stmts.fail_work)
            .bind(params.instance.0)
            .bind(ids)
            .bind(tokens)
            .bind(errors)
            .bind(retry_after)
            .bind(cancelled);
        self.outcome_rows(format!("recording {n} failures"), query)
            .await
    }

    async fn release_work(&self, params: ReleaseWorkParams) -> Result<ReleaseWorkOutcome> {
        if params.items.is_empty() {
            return Ok(OutcomeBatch::default());
        }
        let (ids, tokens) = split_fences(&params.items);
        let n = ids.len();
        let query = sqlx::query_as(&self.stmts.release_work)
            .bind(params.instance.0)
            .bind(ids)
            .bind(tokens)
            .bind(params.consume_attempt);
        self.outcome_rows(format!("releasing {n} leases"), query)
            .await
    }

    async fn checkpoint_work(&self, params: CheckpointWorkParams) -> Result<CheckpointWorkOutcome> {
        validate::validate_checkpoint(&params)?;
        let id = params.fence.id;
        let saved: bool = sqlx::query_scalar(&self.stmts.checkpoint_work)
            .bind(params.instance.0)
            .bind(id)
            .bind(params.fence.token)
            .bind(sqlx::types::Json(&params.checkpoint))
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(format!("saving the checkpoint of item {id}"), e))?;
        if saved {
            Ok(CheckpointWorkOutcome {})
        } else {
            Err(Error::FencedOut { id })
        }
    }

    async fn record_heartbeat(
        &self,
        params: RecordHeartbeatParams,
    ) -> Result<RecordHeartbeatOutcome> {
        validate::validate_stale(params.stale_after, params.dead_after, params.lock_grace)?;
        validate::validate_heartbeat(&params)?;
        let (evicted, reaped, released): (bool, i32, i32) =
            sqlx::query_as(&self.stmts.record_heartbeat)
                .bind(params.instance.0)
                .bind(sanitize_text(&params.host))
                .bind(sqlx::types::Json(&params.metadata))
                .bind(interval(params.stale_after))
                .bind(params.dead_after.map(interval))
                .bind(params.lock_grace.map(interval))
                .bind(match params.alive_lock {
                    AliveLockReport::Unreported => None,
                    AliveLockReport::NotHeld => Some(0),
                    AliveLockReport::Session(pid) => Some(pid.max(0)),
                })
                .bind(params.registering)
                .fetch_one(self.control().await?)
                .await
                .map_err(|e| {
                    self.db_error(
                        format!("recording the heartbeat of instance {}", params.instance),
                        e,
                    )
                })?;
        Ok(RecordHeartbeatOutcome {
            evicted,
            reaped: reaped as u64,
            released: released as u64,
        })
    }

    async fn cleanup_stale_instances(
        &self,
        params: CleanupStaleInstancesParams,
    ) -> Result<CleanupStaleInstancesOutcome> {
        validate::validate_stale(params.stale_after, params.dead_after, params.lock_grace)?;
        let rows: Vec<(uuid::Uuid, i32)> = sqlx::query_as(&self.stmts.cleanup_stale_instances)
            .bind(params.judge.map(|i| i.0))
            .bind(interval(params.stale_after))
            .bind(params.dead_after.map(interval))
            .bind(params.lock_grace.map(interval))
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error("cleaning up stale instances", e))?;
        Ok(CleanupStaleInstancesOutcome {
            reaped: rows
                .into_iter()
                .map(|(id, released)| ReapedInstance {
                    instance: InstanceId(id),
                    released: released as u64,
                })
                .collect(),
        })
    }

    async fn deregister_instance(
        &self,
        params: DeregisterInstanceParams,
    ) -> Result<DeregisterInstanceOutcome> {
        let released: i32 = sqlx::query_scalar(&self.stmts.deregister_instance)
            .bind(params.instance.0)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(format!("deregistering instance {}", params.instance), e))?;
        Ok(DeregisterInstanceOutcome {
            released: released as u64,
        })
    }

    async fn promote_scheduled(
        &self,
        params: PromoteScheduledParams,
    ) -> Result<PromoteScheduledOutcome> {
        params.validate()?;
        let rows: Vec<(String, i32)> = sqlx::query_as(&self.stmts.promote_scheduled)
            .bind(params.limit as i32)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| {
                self.db_error(
                    format!("promoting up to {} scheduled items", params.limit),
                    e,
                )
            })?;
        Ok(PromoteScheduledOutcome {
            queues: rows
                .into_iter()
                .map(|(queue, n)| QueueCount {
                    queue,
                    items: n as u64,
                })
                .collect(),
        })
    }

    async fn dead_letter_expired(
        &self,
        params: DeadLetterExpiredParams,
    ) -> Result<DeadLetterExpiredOutcome> {
        params.validate()?;
        let ctx = || format!("ending up to {} expired orphans", params.limit);
        let rows: Vec<(String, String, i32)> = sqlx::query_as(&self.stmts.dead_letter_expired)
            .bind(params.limit as i32)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let mut outcome = DeadLetterExpiredOutcome::default();
        for (queue, state, n) in rows {
            if state == "running" {
                outcome.released.push(QueueCount {
                    queue,
                    items: n.max(0) as u64,
                });
            } else {
                add_ended(&mut outcome, queue, &state, n, &ctx())?;
            }
        }
        Ok(outcome)
    }

    async fn prune_finished(&self, params: PruneFinishedParams) -> Result<PruneFinishedOutcome> {
        params.validate()?;
        let ctx = || format!("pruning up to {} finished items", params.limit);
        let rows: Vec<(String, i32)> = sqlx::query_as(&self.stmts.prune_finished)
            .bind(interval(params.completed_retention))
            .bind(interval(params.dead_retention))
            .bind(params.limit as i32)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let mut outcome = PruneFinishedOutcome::default();
        for (state, n) in rows {
            let n = n as u64;
            match state.as_str() {
                "partitions_created" => {
                    outcome.partitions_created += n;
                    continue;
                }
                "partitions_dropped" => {
                    outcome.partitions_dropped += n;
                    continue;
                }
                "partitions_busy" => {
                    outcome.partitions_busy = n > 0;
                    continue;
                }
                _ => {}
            }
            match parse_state(&state, &ctx())? {
                WorkState::Completed => outcome.completed += n,
                WorkState::Dead => outcome.dead += n,
                WorkState::Cancelled => outcome.cancelled += n,
                other => {
                    return Err(Error::database(
                        ctx(),
                        format!("prune_finished reported state {other}"),
                    ))
                }
            }
        }
        Ok(outcome)
    }

    async fn ordering_repair(&self, params: OrderingRepairParams) -> Result<OrderingRepairOutcome> {
        params.validate()?;
        let repaired: i32 = sqlx::query_scalar(&self.stmts.ordering_repair)
            .bind(params.limit as i32)
            .bind(interval(params.every))
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| {
                self.db_error(format!("repairing up to {} ordering keys", params.limit), e)
            })?;
        Ok(OrderingRepairOutcome {
            repaired: repaired.max(0) as u64,
        })
    }

    async fn vacuum_work(&self, _params: VacuumWorkParams) -> Result<VacuumWorkOutcome> {
        let ctx = "vacuuming the work table";
        let pool = self.control().await?;
        let due: bool = sqlx::query_scalar(&self.stmts.work_vacuum_due)
            .fetch_one(pool)
            .await
            .map_err(|e| self.db_error("asking whether the work table is due a vacuum", e))?;
        if !due {
            return Ok(VacuumWorkOutcome { vacuumed: false });
        }
        // Detached: the session leaves the pool and is closed after the vacuum, so neither the
        // setting vacuum_quietly makes nor a vacuum abandoned at the sweep's call timeout
        // (its future dropped mid-statement) comes back to the pool with it.
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| self.db_error(ctx, e))?
            .detach();
        let vacuumed = vacuum_quietly(&mut conn, &self.stmts.vacuum_work).await;
        let _ = conn.close().await;
        vacuumed
            .map(|()| VacuumWorkOutcome { vacuumed: true })
            .map_err(|e| self.db_error(ctx, e))
    }

    async fn prune_evicted_instances(
        &self,
        params: PruneEvictedInstancesParams,
    ) -> Result<PruneEvictedInstancesOutcome> {
        params.validate()?;
        let pruned: i32 = sqlx::query_scalar(&self.stmts.prune_evicted_instances)
            .bind(interval(params.retention))
            .bind(params.limit as i32)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| {
                self.db_error(
                    format!("pruning up to {} eviction tombstones", params.limit),
                    e,
                )
            })?;
        Ok(PruneEvictedInstancesOutcome {
            pruned: pruned as u64,
        })
    }

    async fn maintenance_due(&self, params: MaintenanceDueParams) -> Result<MaintenanceDueOutcome> {
        params.validate()?;
        let (instances, orphans, scheduled, finished, tombstones, vacuum): (
            bool,
            bool,
            bool,
            bool,
            bool,
            bool,
        ) = sqlx::query_as(&self.stmts.maintenance_due)
            .bind(params.judge.map(|i| i.0))
            .bind(interval(params.stale_after))
            .bind(params.dead_after.map(interval))
            .bind(params.lock_grace.map(interval))
            .bind(interval(params.completed_retention))
            .bind(interval(params.dead_retention))
            .bind(interval(params.evicted_retention))
            .bind(interval(params.lapsed_look_every))
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error("asking which maintenance steps have work", e))?;
        Ok(MaintenanceDueOutcome {
            instances,
            orphans,
            scheduled,
            finished,
            tombstones,
            vacuum,
        })
    }

    async fn queue_depth(&self, params: QueueDepthParams) -> Result<QueueDepthOutcome> {
        params.validate()?;
        let ctx = "counting items per queue and state";
        let rows: Vec<(String, String, i64, f64, f64)> = sqlx::query_as(&self.stmts.queue_depth)
            .bind(interval(params.max_age))
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx, e))?;
        let sample_age = rows.first().map_or(Duration::ZERO, |r| seconds(r.4));
        let depths = rows
            .into_iter()
            .map(|(queue, state, items, oldest_due_age, _)| {
                Ok(QueueDepth {
                    queue,
                    state: parse_state(&state, ctx)?,
                    items: items.max(0) as u64,
                    oldest_due_age: seconds(oldest_due_age),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(QueueDepthOutcome { depths, sample_age })
    }

    async fn server_status(&self, _params: ServerStatusParams) -> Result<ServerStatusOutcome> {
        let usage: f64 = sqlx::query_scalar(&self.stmts.server_status)
            .fetch_one(&self.control)
            .await
            .map_err(|e| db_error("reading the server's status", e))?;
        Ok(ServerStatusOutcome {
            notification_queue_usage: usage,
        })
    }

    async fn take_alive_lock(&self, params: TakeAliveLockParams) -> Result<TakeAliveLockOutcome> {
        alive_lock::PgAliveLock::open(
            self.sessions(),
            self.stmts.dedicated_session.clone(),
            self.stmts.take_alive_lock.clone(),
            format!("{}.alive", self.schema),
            params.instance,
        )
        .await
    }

    async fn listen(&self, _params: ListenParams) -> Result<Box<dyn WakeListener>> {
        let listener = listener::PgWakeListener::open(
            self.sessions(),
            self.wake_channel(),
            self.stmts.dedicated_session.clone(),
        )
        .await?;
        Ok(Box::new(listener))
    }

    async fn fire_periodic(&self, params: FirePeriodicParams) -> Result<FirePeriodicOutcome> {
        params.validate()?;
        let ctx = || format!("firing periodic schedule {:?}", params.name);
        // Producers' traffic (it enqueues): the main pool. The claim and the enqueue are one
        // transaction, so a fire time is enqueued exactly once or not at all.
        let mut tx = self.begin(ctx).await?;
        let (fire_at, next_fire_at) = match &params.fire {
            Some(f) => (Some(f.fire_at), f.next_fire_at),
            None => (None, None),
        };
        let (result, last_fire_at, fingerprint, db_now): (
            String,
            Option<DateTime<Utc>>,
            Option<String>,
            DateTime<Utc>,
        ) = sqlx::query_as(&self.stmts.fire_periodic)
            .bind(&params.name)
            .bind(&params.fingerprint)
            .bind(fire_at)
            .bind(next_fire_at)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let result = match (result.as_str(), params.fire) {
            ("fired", Some(fire)) => {
                let out = self
                    .enqueue_with(
                        &mut tx,
                        EnqueueWorkParams {
                            items: vec![fire.work],
                        },
                    )
                    .await?;
                let enqueued = out.items.first().copied().ok_or_else(|| {
                    Error::database(ctx(), "enqueue_work answered no item for the fire time")
                })?;
                FireResult::Fired(enqueued)
            }
            ("state", _) => FireResult::State,
            ("not_due", _) => FireResult::NotDue,
            ("overtaken", _) => FireResult::Overtaken,
            ("already_fired", _) => FireResult::AlreadyFired,
            (other, _) => {
                return Err(Error::database(
                    ctx(),
                    format!("fire_periodic answered {other:?}"),
                ))
            }
        };
        tx.commit().await.map_err(|e| self.db_error(ctx(), e))?;
        Ok(FirePeriodicOutcome {
            result,
            last_fire_at,
            fingerprint,
            db_now,
        })
    }
}

#[async_trait]
impl Operations for PgCoordinator {
    async fn cancel_work(&self, params: CancelWorkParams) -> Result<CancelWorkOutcome> {
        let ctx = || format!("cancelling work item {}", params.id);
        let answer: String = sqlx::query_scalar(&self.stmts.cancel_work)
            .bind(params.id)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        let cancellation = match answer.as_str() {
            "cancelled" => Cancellation::Cancelled,
            "requested" => Cancellation::Requested,
            other => {
                return Err(Error::database(
                    ctx(),
                    format!("cancel_work answered {other:?}"),
                ))
            }
        };
        Ok(CancelWorkOutcome { cancellation })
    }

    async fn retry_dead_work(&self, params: RetryDeadWorkParams) -> Result<RetryDeadWorkOutcome> {
        let queue: String = sqlx::query_scalar(&self.stmts.retry_dead_work)
            .bind(params.id)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(format!("retrying dead letter {}", params.id), e))?;
        Ok(RetryDeadWorkOutcome { queue })
    }

    async fn discard_work(&self, params: DiscardWorkParams) -> Result<DiscardWorkOutcome> {
        let ctx = || format!("discarding work item {}", params.id);
        let state: String = sqlx::query_scalar(&self.stmts.discard_work)
            .bind(params.id)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        Ok(DiscardWorkOutcome {
            state: parse_state(&state, &ctx())?,
        })
    }

    async fn is_instance_alive(
        &self,
        params: IsInstanceAliveParams,
    ) -> Result<IsInstanceAliveOutcome> {
        let alive: bool = sqlx::query_scalar(&self.stmts.is_instance_alive)
            .bind(params.instance.0)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| {
                self.db_error(
                    format!("checking the alive-lock of instance {}", params.instance),
                    e,
                )
            })?;
        Ok(IsInstanceAliveOutcome { alive })
    }

    async fn list_work(&self, params: ListWorkParams) -> Result<ListWorkOutcome> {
        let size = params.validate()?;
        let ctx = "listing work items";
        let filter = serde_json::to_value(&params.filter)
            .map_err(|e| Error::InvalidArgument(format!("list_work: the filter: {e}")))?;
        let rows: Vec<ListRow> = sqlx::query_as(&self.stmts.list_work)
            .bind(sqlx::types::Json(filter))
            .bind(params.cursor.as_deref())
            .bind(size as i32)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx, e))?;
        let mut outcome = ListWorkOutcome::default();
        for r in rows {
            let Some(id) = r.id else {
                outcome.next_cursor = r.next_cursor;
                outcome.scan_exhausted = r.scan_exhausted.unwrap_or(false);
                continue;
            };
            let missing = || Error::database(ctx, format!("list_work row {id} lacks a column"));
            outcome.items.push(WorkSummary {
                id,
                queue: r.queue.ok_or_else(missing)?,
                kind: r.kind,
                ordering_key: r.ordering_key,
                state: parse_state(r.state.as_deref().unwrap_or(""), ctx)?,
                priority: r.priority.ok_or_else(missing)?,
                attempt: r.attempt.ok_or_else(missing)?,
                max_attempts: r.max_attempts.ok_or_else(missing)?,
                run_at: r.run_at.ok_or_else(missing)?,
                created_at: r.created_at.ok_or_else(missing)?,
                finished_at: r.finished_at,
                instance: r.instance_id.map(InstanceId),
                lease_expiry: r.lease_expiry,
                cancel_requested: r.cancel_requested.unwrap_or(false),
                last_error: r.last_error,
            });
        }
        Ok(outcome)
    }

    async fn get_work(&self, params: GetWorkParams) -> Result<GetWorkOutcome> {
        let ctx = format!("reading work item {}", params.id);
        let r: DetailRow = sqlx::query_as(&self.stmts.get_work)
            .bind(params.id)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx.clone(), e))?;
        Ok(GetWorkOutcome {
            item: WorkDetail {
                id: r.id,
                queue: r.queue,
                state: parse_state(&r.state, &ctx)?,
                priority: r.priority,
                attempt: r.attempt,
                max_attempts: r.max_attempts,
                run_at: r.run_at,
                created_at: r.created_at,
                finished_at: r.finished_at,
                instance: r.instance_id.map(InstanceId),
                lease_expiry: r.lease_expiry,
                claim_token: r.claim_token,
                renewals: r.renewals,
                cancel_requested: r.cancel_requested,
                kind: r.kind,
                payload: r.payload,
                metadata: r.metadata,
                checkpoint: r.checkpoint,
                history: r
                    .errors
                    .as_array()
                    .map(|a| a.iter().map(HistoryEntry::from_json).collect())
                    .unwrap_or_default(),
                unique_key: r.unique_key,
                ordering_key: r.ordering_key,
            },
            now: r.db_now,
        })
    }

    async fn queue_overview(&self, _params: QueueOverviewParams) -> Result<QueueOverviewOutcome> {
        let rows: Vec<OverviewRow> = sqlx::query_as(&self.stmts.queue_overview)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error("reading the queues' overview", e))?;
        let mut outcome = QueueOverviewOutcome::default();
        for r in rows {
            outcome.now = Some(r.db_now);
            outcome.queues.push(QueueOverview {
                queue: r.queue,
                registered: r.registered,
                paused: r.paused,
                max_attempts: r.max_attempts,
                owner: r.owner,
                available: r.available.max(0) as u64,
                scheduled: r.scheduled.max(0) as u64,
                running: r.running.max(0) as u64,
                blocked: r.blocked.max(0) as u64,
                max_running: r.max_running.map(|n| n.max(0) as u32),
                rate_limit: rate_limit(r.rate_limit, r.rate_period),
                completed: Count {
                    items: r.completed.max(0) as u64,
                    exact: r.completed_exact,
                },
                dead: Count {
                    items: r.dead.max(0) as u64,
                    exact: r.dead_exact,
                },
                cancelled: Count {
                    items: r.cancelled.max(0) as u64,
                    exact: r.cancelled_exact,
                },
                pickup_lag: r.pickup_lag.map(interval_to_duration),
                completed_per_minute: Rate {
                    per_minute: r.completed_per_minute,
                    exact: r.completed_rate_exact,
                },
                failed_per_minute: r.failed_per_minute,
                dead_per_minute: Rate {
                    per_minute: r.dead_per_minute,
                    exact: r.dead_rate_exact,
                },
            });
        }
        Ok(outcome)
    }

    async fn list_instances(&self, _params: ListInstancesParams) -> Result<ListInstancesOutcome> {
        let rows: Vec<InstanceListRow> = sqlx::query_as(&self.stmts.list_instances)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error("listing instances", e))?;
        let instances = rows
            .into_iter()
            .map(|r| {
                let mut in_flight: Vec<QueueCount> = r
                    .in_flight
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(q, n)| QueueCount {
                                queue: q.clone(),
                                items: n.as_u64().unwrap_or(0),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                in_flight.sort_by(|a, b| a.queue.cmp(&b.queue));
                InstanceSummary {
                    instance: InstanceId(r.instance_id),
                    host: r.host,
                    pid: r.metadata["pid"].as_i64(),
                    version: r.metadata["version"].as_str().map(str::to_owned),
                    metadata: r.metadata,
                    started_at: r.started_at,
                    last_heartbeat_at: r.last_heartbeat_at,
                    heartbeat_age: interval_to_duration(r.heartbeat_age),
                    alive_lock_held: r.alive_lock_held,
                    leases: r.leases.max(0) as u64,
                    expired_leases: r.expired_leases.max(0) as u64,
                    in_flight,
                }
            })
            .collect();
        Ok(ListInstancesOutcome { instances })
    }

    async fn pause_queue(&self, params: PauseQueueParams) -> Result<PauseQueueOutcome> {
        let changed: bool = sqlx::query_scalar(&self.stmts.pause_queue)
            .bind(&params.queue)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(format!("pausing queue {:?}", params.queue), e))?;
        Ok(PauseQueueOutcome { changed })
    }

    async fn resume_queue(&self, params: ResumeQueueParams) -> Result<ResumeQueueOutcome> {
        let changed: bool = sqlx::query_scalar(&self.stmts.resume_queue)
            .bind(&params.queue)
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(format!("resuming queue {:?}", params.queue), e))?;
        Ok(ResumeQueueOutcome { changed })
    }

    async fn bulk_work(&self, params: BulkWorkParams) -> Result<BulkWorkOutcome> {
        params.validate()?;
        let ctx = format!("{} of {} items", params.action.as_str(), params.ids.len());
        let rows: Vec<(i64, String, Option<String>, Option<String>)> =
            sqlx::query_as(&self.stmts.bulk_work)
                .bind(params.action.as_str())
                .bind(&params.ids)
                .fetch_all(self.control().await?)
                .await
                .map_err(|e| self.db_error(ctx.clone(), e))?;
        let items = rows
            .into_iter()
            .map(|(id, result, state, reason)| bulk_item(id, &result, state, reason, &ctx))
            .collect::<Result<Vec<_>>>()?;
        Ok(BulkWorkOutcome { items })
    }

    async fn bulk_work_matching(
        &self,
        params: BulkWorkMatchingParams,
    ) -> Result<BulkWorkMatchingOutcome> {
        params.validate()?;
        let ctx = format!(
            "{} of up to {} matching items",
            params.action.as_str(),
            params.limit
        );
        let filter = serde_json::to_value(&params.filter)
            .map_err(|e| Error::InvalidArgument(format!("bulk_work_matching: the filter: {e}")))?;
        let rows: Vec<(i64, String, Option<String>, Option<String>, bool)> =
            sqlx::query_as(&self.stmts.bulk_work_matching)
                .bind(params.action.as_str())
                .bind(sqlx::types::Json(filter))
                .bind(params.all)
                .bind(params.limit as i32)
                .fetch_all(self.control().await?)
                .await
                .map_err(|e| self.db_error(ctx.clone(), e))?;
        let has_more = rows.iter().any(|r| r.4);
        let items = rows
            .into_iter()
            .map(|(id, result, state, reason, _)| bulk_item(id, &result, state, reason, &ctx))
            .collect::<Result<Vec<_>>>()?;
        Ok(BulkWorkMatchingOutcome { items, has_more })
    }

    async fn set_queue_settings(
        &self,
        params: SetQueueSettingsParams,
    ) -> Result<SetQueueSettingsOutcome> {
        params.validate()?;
        let ctx = || format!("setting queue {:?}'s settings", params.queue);
        let rate = params.rate_limit.flatten();
        let row: SettingsRow = sqlx::query_as(&self.stmts.set_queue_settings)
            .bind(&params.queue)
            .bind(params.max_attempts)
            .bind(params.owner.clone().flatten())
            .bind(params.owner.is_some())
            .bind(params.ordering_dead_head.map(OrderingDeadHead::as_str))
            .bind(params.max_running.is_some())
            .bind(params.max_running.flatten().map(|n| n as i32))
            .bind(params.rate_limit.is_some())
            .bind(rate.map(|r| r.limit as i32))
            .bind(rate.map(|r| interval(r.period)))
            .fetch_one(self.control().await?)
            .await
            .map_err(|e| self.db_error(ctx(), e))?;
        Ok(SetQueueSettingsOutcome {
            owner: row.owner,
            max_attempts: row.max_attempts,
            ordering_dead_head: OrderingDeadHead::parse(&row.ordering_dead_head)
                .map_err(|e| Error::database(ctx(), e.to_string()))?,
            max_running: row.max_running.map(|n| n.max(0) as u32),
            rate_limit: rate_limit(row.rate_limit, row.rate_period),
        })
    }

    async fn list_held_keys(&self, params: ListHeldKeysParams) -> Result<ListHeldKeysOutcome> {
        params.validate()?;
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(&self.stmts.list_held_keys)
            .bind(params.queue.as_deref())
            .bind(params.limit as i32)
            .fetch_all(self.control().await?)
            .await
            .map_err(|e| self.db_error("listing ordering keys held by a dead head", e))?;
        Ok(ListHeldKeysOutcome {
            keys: rows
                .into_iter()
                .map(|(queue, ordering_key, dead_id, blocked)| HeldKey {
                    queue,
                    ordering_key,
                    dead_id,
                    blocked: blocked.max(0) as u64,
                })
                .collect(),
        })
    }
}

fn bulk_item(
    id: WorkId,
    result: &str,
    state: Option<String>,
    reason: Option<String>,
    ctx: &str,
) -> Result<BulkItem> {
    let state_before = match state {
        Some(s) => Some(parse_state(&s, ctx)?),
        None => None,
    };
    let result = match (result, state_before) {
        ("retried", _) => BulkResult::Retried,
        ("cancelled", _) => BulkResult::Cancelled,
        ("requested", _) => BulkResult::Requested,
        ("discarded", _) => BulkResult::Discarded,
        ("promoted", _) => BulkResult::Promoted,
        ("not_found", _) => BulkResult::NotFound,
        ("refused", Some(state)) => BulkResult::Refused {
            state,
            reason: reason.unwrap_or_default(),
        },
        (other, _) => {
            return Err(Error::database(
                ctx.to_owned(),
                format!("bulk_work answered {other:?} for item {id}"),
            ))
        }
    };
    Ok(BulkItem {
        id,
        state_before,
        result,
    })
}

#[derive(sqlx::FromRow)]
struct ListRow {
    id: Option<i64>,
    queue: Option<String>,
    kind: Option<String>,
    ordering_key: Option<String>,
    state: Option<String>,
    priority: Option<i16>,
    attempt: Option<i32>,
    max_attempts: Option<i32>,
    run_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    instance_id: Option<uuid::Uuid>,
    lease_expiry: Option<DateTime<Utc>>,
    cancel_requested: Option<bool>,
    last_error: Option<String>,
    next_cursor: Option<String>,
    scan_exhausted: Option<bool>,
}

#[derive(sqlx::FromRow)]
struct DetailRow {
    id: i64,
    queue: String,
    state: String,
    priority: i16,
    attempt: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    instance_id: Option<uuid::Uuid>,
    lease_expiry: Option<DateTime<Utc>>,
    claim_token: Option<i64>,
    renewals: i32,
    cancel_requested: bool,
    kind: Option<String>,
    payload: Value,
    metadata: Option<Value>,
    checkpoint: Option<Value>,
    errors: Value,
    unique_key: Option<String>,
    ordering_key: Option<String>,
    db_now: DateTime<Utc>,
}

/// A queue's settings as register_queue and set_queue_settings return them.
#[derive(sqlx::FromRow)]
struct SettingsRow {
    #[sqlx(default)]
    applied: Option<bool>,
    owner: Option<String>,
    max_attempts: i32,
    ordering_dead_head: String,
    max_running: Option<i32>,
    rate_limit: Option<i32>,
    rate_period: Option<PgInterval>,
}

#[derive(sqlx::FromRow)]
struct OverviewRow {
    queue: String,
    registered: bool,
    paused: bool,
    max_attempts: Option<i32>,
    owner: Option<String>,
    available: i64,
    scheduled: i64,
    running: i64,
    blocked: i64,
    completed: i64,
    completed_exact: bool,
    dead: i64,
    dead_exact: bool,
    cancelled: i64,
    cancelled_exact: bool,
    pickup_lag: Option<PgInterval>,
    completed_per_minute: f64,
    completed_rate_exact: bool,
    dead_per_minute: f64,
    dead_rate_exact: bool,
    failed_per_minute: f64,
    max_running: Option<i32>,
    rate_limit: Option<i32>,
    rate_period: Option<PgInterval>,
    db_now: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct InstanceListRow {
    instance_id: uuid::Uuid,
    host: String,
    metadata: Value,
    started_at: DateTime<Utc>,
    last_heartbeat_at: DateTime<Utc>,
    heartbeat_age: PgInterval,
    alive_lock_held: bool,
    leases: i64,
    expired_leases: i64,
    in_flight: Value,
}

/// A PostgreSQL interval of days and microseconds (what `now() - timestamptz` gives) as a
/// duration; negative parts count as zero.
/// A stored rate limit (`rate_limit`, `rate_period`, set together or not at all).
fn rate_limit(limit: Option<i32>, period: Option<PgInterval>) -> Option<RateLimit> {
    Some(RateLimit::new(
        limit?.max(0) as u32,
        interval_to_duration(period?),
    ))
}

fn interval_to_duration(i: PgInterval) -> Duration {
    let micros = i64::from(i.days) * 86_400_000_000 + i.microseconds;
    Duration::from_micros(micros.max(0) as u64)
}

/// Where the dedicated sessions (the alive-lock, LISTEN) connect: a pool of one connection
/// each, with the main pool's options as they are when the session opens — with a
/// multi-host URL, on the coordinator's current host (searched first if suspect), checked
/// like every pool connection.
#[derive(Clone)]
pub(super) struct Sessions {
    pool: PgPool,
    failover: Option<Arc<Failover>>,
}

impl Sessions {
    /// A lazily connected pool of one connection for one dedicated session.
    pub(super) async fn pool(&self, acquire_timeout: Duration) -> Result<PgPool> {
        let options = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(acquire_timeout);
        match &self.failover {
            Some(failover) => {
                failover.ensure().await?;
                Ok(failover.session_pool(options))
            }
            None => Ok(options.connect_lazy_with((*self.pool.connect_options()).clone())),
        }
    }

    /// A session was lost: its server may be gone, so look for the host before the next
    /// call or session.
    pub(super) fn lost(&self) {
        if let Some(failover) = &self.failover {
            failover.suspect();
        }
    }

    /// [`db_error`], after noting an error that says the server is gone or read-only.
    pub(super) fn db_error(&self, context: impl Into<String>, e: sqlx::Error) -> Error {
        noted(self.failover.as_deref(), context, e)
    }
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    /// NULL (with every item column) on a status row (throttled, or orphans ended).
    id: Option<i64>,
    queue: String,
    priority: Option<i16>,
    attempt: Option<i32>,
    max_attempts: Option<i32>,
    claim_token: Option<i64>,
    lease_expiry: Option<DateTime<Utc>>,
    kind: Option<String>,
    payload: Option<Value>,
    metadata: Option<Value>,
    checkpoint: Option<Value>,
    created_at: Option<DateTime<Utc>>,
    reclaimed: Option<bool>,
    pickup_lag: Option<f64>,
    has_more: bool,
    throttle: Option<String>,
    throttle_wait: Option<f64>,
    /// On an ended-orphans status row: their state (`dead`, `cancelled`) and how many.
    ended: Option<String>,
    ended_items: Option<i32>,
}

/// A row of `complete_work`: the claim, whether it was recorded, and the item handed on
/// after it (`next_*`: claim_work's columns of it; `next_id` NULL: none).
#[derive(sqlx::FromRow)]
struct CompleteRow {
    id: i64,
    claim_token: i64,
    recorded: bool,
    next_id: Option<i64>,
    next_queue: Option<String>,
    next_priority: Option<i16>,
    next_attempt: Option<i32>,
    next_max_attempts: Option<i32>,
    next_claim_token: Option<i64>,
    next_lease_expiry: Option<DateTime<Utc>>,
    next_kind: Option<String>,
    next_payload: Option<Value>,
    next_metadata: Option<Value>,
    next_checkpoint: Option<Value>,
    next_created_at: Option<DateTime<Utc>>,
}

impl CompleteRow {
    /// The item handed on after this claim, if any.
    fn next(&mut self, ctx: &dyn Fn() -> String) -> Result<Option<ClaimedWork>> {
        let Some(id) = self.next_id.take() else {
            return Ok(None);
        };
        let missing = |column: &str| {
            Error::database(
                ctx(),
                format!("the item handed on after item {} has no {column}", self.id),
            )
        };
        Ok(Some(ClaimedWork {
            fence: Fence {
                id,
                token: self
                    .next_claim_token
                    .ok_or_else(|| missing("claim_token"))?,
            },
            queue: self.next_queue.take().ok_or_else(|| missing("queue"))?,
            kind: self.next_kind.take(),
            payload: self.next_payload.take().ok_or_else(|| missing("payload"))?,
            metadata: self.next_metadata.take(),
            priority: self.next_priority.ok_or_else(|| missing("priority"))?,
            attempt: self.next_attempt.ok_or_else(|| missing("attempt"))?,
            max_attempts: self
                .next_max_attempts
                .ok_or_else(|| missing("max_attempts"))?,
            checkpoint: self.next_checkpoint.take(),
            lease_expiry: self
                .next_lease_expiry
                .ok_or_else(|| missing("lease_expiry"))?,
            created_at: self.next_created_at.ok_or_else(|| missing("created_at"))?,
            reclaimed: false,
            pickup_lag: None,
        }))
    }
}

fn split_fences(fences: &[Fence]) -> (Vec<i64>, Vec<i64>) {
    fences.iter().map(|f| (f.id, f.token)).unzip()
}

/// Adds a row of ended orphans — a queue, the state they ended in, how many — to `outcome`:
/// `dead_letter_expired`'s rows and `claim_work`'s status rows alike.
fn add_ended(
    outcome: &mut DeadLetterExpiredOutcome,
    queue: String,
    state: &str,
    items: i32,
    ctx: &str,
) -> Result<()> {
    let count = QueueCount {
        queue,
        items: items.max(0) as u64,
    };
    match parse_state(state, ctx)? {
        WorkState::Dead => outcome.dead.push(count),
        WorkState::Cancelled => outcome.cancelled.push(count),
        other => {
            return Err(Error::database(
                ctx.to_owned(),
                format!("orphans reported ended in state {other}"),
            ))
        }
    }
    Ok(())
}

fn parse_state(s: &str, ctx: &str) -> Result<WorkState> {
    WorkState::parse(s)
        .ok_or_else(|| Error::database(ctx.to_owned(), format!("unknown work state {s:?}")))
}

/// Seconds the store computed (a non-negative float8) as a duration; a negative or non-finite
/// value, which the store never returns, reads as zero.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
}

/// Runs `vacuum` (a `VACUUM` statement) on `conn` with `client_min_messages = error`, which it
/// leaves set (the caller closes the session). Each statement goes alone, by the simple
/// protocol: VACUUM cannot run in a transaction (nor as a prepared statement in a pipeline).
/// When `SKIP_LOCKED` skips the table (a peer's or autovacuum's vacuum holds it), PostgreSQL
/// says so in a WARNING that sqlx would log as one; the setting keeps it quiet.
async fn vacuum_quietly(
    conn: &mut PgConnection,
    vacuum: &str,
) -> std::result::Result<(), sqlx::Error> {
    use sqlx::Executor as _;
    // A plain &str binds nothing and goes by the simple protocol.
    conn.execute("SET client_min_messages = error").await?;
    conn.execute(vacuum).await?;
    Ok(())
}

/// A duration as a PostgreSQL interval, at its microsecond resolution.
fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: micros(d),
    }
}

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// [`db_error`], after telling `failover` (a multi-host URL's) about `e`, which makes the
/// next call look for the host again when `e` says the server is gone or read-only.
fn noted(failover: Option<&Failover>, context: impl Into<String>, e: sqlx::Error) -> Error {
    if let Some(failover) = failover {
        failover.note(&e);
    }
    db_error(context, e)
}

/// Maps a driver error to the variant a caller acts on: the SQL functions raise `WP001`
/// (unknown queue; the name in DETAIL), `WP002` (invalid argument) with messages that name
/// the problem, `WP004` (work item not found) and `WP005` (invalid state), those two with
/// DETAIL as JSON `{"id": .., "state": .., "reason": ..}`. A WP004/WP005 whose DETAIL does not
/// read stays a database error with its message.
pub(crate) fn db_error(context: impl Into<String>, e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(d) = &e {
        let detail = || {
            d.try_downcast_ref::<PgDatabaseError>()
                .and_then(|pg| pg.detail())
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
        };
        match d.code().as_deref() {
            Some("WP004") => {
                if let Some(id) = detail().and_then(|v| v["id"].as_i64()) {
                    return Error::NotFound { id };
                }
            }
            Some("WP005") => {
                if let Some(v) = detail() {
                    let state = v["state"].as_str().and_then(WorkState::parse);
                    if let (Some(id), Some(state)) = (v["id"].as_i64(), state) {
                        return Error::InvalidState {
                            id,
                            state,
                            reason: v["reason"].as_str().unwrap_or_default().to_owned(),
                        };
                    }
                }
            }
            Some("WP001") => {
                let queue = d
                    .try_downcast_ref::<PgDatabaseError>()
                    .and_then(|pg| pg.detail())
                    .unwrap_or_default()
                    .to_owned();
                return Error::UnknownQueue(queue);
            }
            Some("WP002") => return Error::InvalidArgument(d.message().to_owned()),
            _ => {}
        }
    }
    Error::database(context, e)
}

/// The distinct queues of a batch that may have work due now, to wake after it committed:
/// items due at once, and items at a business time (which may be past: whether it is, only
/// the database's clock says, so they are woken for; a wake for nothing costs one empty
/// claim). An item delayed by `run_after` is scheduled: promotion wakes its queue when due.
/// The wake signals owed for items enqueued in a caller's transaction that did not notify
/// ([`PgCoordinator::enqueue_deferring_wake`]): send them with [`PgCoordinator::wake`] after
/// the transaction commits; drop them when it rolls back. Several merge into one
/// ([`merge`](Self::merge)), one signal per queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use = "the claimers are not woken until this is passed to PgCoordinator::wake after the commit"]
pub struct PendingWake {
    queues: Vec<String>,
}

impl PendingWake {
    /// The queues to wake, sorted, each once.
    pub fn queues(&self) -> &[String] {
        &self.queues
    }

    /// Adds `other`'s queues to these.
    pub fn merge(&mut self, other: PendingWake) {
        self.queues.extend(other.queues);
        self.queues.sort_unstable();
        self.queues.dedup();
    }
}

fn due_queues(params: &EnqueueWorkParams) -> Vec<String> {
    let mut queues: Vec<String> = params
        .items
        .iter()
        .filter(|i| match i.schedule {
            Schedule::Now | Schedule::At(_) => true,
            Schedule::After(d) => d.is_zero(),
        })
        .map(|i| i.queue.clone())
        .collect();
    queues.sort_unstable();
    queues.dedup();
    queues
}
