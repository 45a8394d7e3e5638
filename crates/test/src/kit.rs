//! [`TestKit`]: a test's view of a real store — what was enqueued, a drain of one queue through
//! the real claim path, and scheduled items made due.

use std::collections::{HashMap, HashSet};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::ClaimWorker;
use workpump_coordinator::{
    BulkAction, BulkWorkMatchingParams, GetWorkParams, JobArgs, ListWorkParams, Operations,
    PgCoordinator, QueueOverviewParams, RegisterQueueParams, WorkCoordinator, WorkDetail,
    WorkFilter, WorkId, WorkState, WorkSummary, Worker, WorkerError, DEFAULT_SCHEMA, MAX_PAGE_SIZE,
};
use workpump_host::{Client, Host, HostBuilder, HostError};

/// How long a drain runs at most unless told ([`Drain::timeout`]). **30 s.**
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a drain asks the store whether the queue is done.
const DRAIN_CHECK: Duration = Duration::from_millis(20);

/// The registration a drain's host is built with (see [`TestKit::jobs`]).
type Register = Arc<dyn Fn(HostBuilder) -> HostBuilder + Send + Sync>;

/// What went wrong in a kit's call (its assertions panic instead, as assertions do).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store refused or failed a call.
    #[error(transparent)]
    Store(#[from] workpump_coordinator::Error),
    /// The drain's host did not start or stopped with an error.
    #[error("the drain's host: {0}")]
    Host(#[source] HostError),
    /// A drain was asked of a kit without handlers.
    #[error(
        "drain of queue {0:?}: the kit has no handlers; register them with TestKit::jobs(|builder| builder.job(..))"
    )]
    NoJobs(String),
    /// The registration has no handler for the drained queue.
    #[error("drain of queue {queue:?}: TestKit::jobs registers no handler for it (its queues: {registered})")]
    NoHandler {
        /// The queue.
        queue: String,
        /// The queues it has handlers for.
        registered: String,
    },
    /// The drained queue is paused: nothing of it would run.
    #[error("drain of queue {0:?}: the queue is paused, so nothing of it can be claimed; resume it first")]
    Paused(String),
    /// Items were still due or running when the drain's time ran out.
    #[error("drain of queue {queue:?} did not finish within {timeout:?}: {left}")]
    Timeout {
        /// The queue.
        queue: String,
        /// The drain's timeout.
        timeout: Duration,
        /// What was left, in words.
        left: String,
    },
    /// An enqueued item's payload does not decode into the job type asked for.
    #[error("item {id} of kind {kind:?}: its payload does not decode into {ty}: {source}")]
    Decode {
        /// The item.
        id: WorkId,
        /// Its kind.
        kind: String,
        /// The type asked for.
        ty: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// How the items a drain ran ended: each counts once, by its state when the drain was done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainCounts {
    /// Completed.
    pub completed: u64,
    /// Failed an attempt and wait for their retry, scheduled after their backoff (a panic, a
    /// retry the handler asked for, a kind without a handler).
    pub retried: u64,
    /// Dead letters: rejected by their handler, undecodable, or out of attempts.
    pub dead: u64,
    /// Cancelled by their handler.
    pub cancelled: u64,
}

impl DrainCounts {
    /// Items the drain ran in all.
    pub fn total(&self) -> u64 {
        self.completed + self.retried + self.dead + self.cancelled
    }
}

/// A test's handle on a real, migrated store (your test database): what was enqueued, drains,
/// and the clock of scheduled items. Cheap to clone.
///
/// ```no_run
/// use serde::{Deserialize, Serialize};
/// use workpump_host::{handler_fn, HostBuilder, Job, JobArgs};
/// use workpump_test::TestKit;
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct SendEmail { to: String }
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
///     const QUEUE: &'static str = "emails";
/// }
///
/// /// The service's registration, shared by its main and its tests.
/// fn jobs(builder: HostBuilder) -> HostBuilder {
///     builder.job(handler_fn(|_job: Job<SendEmail>| async move { Ok(()) }))
/// }
///
/// # async fn example() -> Result<(), workpump_test::Error> {
/// let kit = TestKit::connect("postgres://app@localhost/app_test").await?.jobs(jobs);
/// kit.declare_queue(SendEmail::QUEUE).await?;
/// kit.client().enqueue(SendEmail { to: "a@b.c".into() }).await?; // your producer
/// kit.assert_enqueued(&SendEmail { to: "a@b.c".into() }).await;
/// let counts = kit.drain("emails").await?;
/// assert_eq!(counts.completed, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TestKit {
    pg: PgCoordinator,
    jobs: Option<Register>,
}

impl TestKit {
    /// A kit on `pg`, a migrated store (in workpump's own tests
    /// `workpump_coordinator::testing::fresh_store()`'s coordinator).
    pub fn new(pg: PgCoordinator) -> Self {
        TestKit { pg, jobs: None }
    }

    /// Connects to `url` (the `workpump` schema) and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pg = PgCoordinator::connect_lazy(url, DEFAULT_SCHEMA, 5)?;
        pg.migrate().await?;
        Ok(Self::new(pg))
    }

    /// The handlers a drain runs: `register` adds them to a host builder as your service does
    /// (`builder.job(..).handler(..)`; share the function with your `main`). A drain builds a
    /// host with it on this kit's store, claiming from the drained queue only, without
    /// periodic jobs; settings given there (`.configure(..)`, `.config(..)`) apply, but the
    /// store, the poll cadence and the metrics endpoint are the drain's.
    pub fn jobs(
        mut self,
        register: impl Fn(HostBuilder) -> HostBuilder + Send + Sync + 'static,
    ) -> Self {
        self.jobs = Some(Arc::new(register));
        self
    }

    /// The store.
    pub fn pg(&self) -> &PgCoordinator {
        &self.pg
    }

    /// A producer on the store (`enqueue`, `enqueue_many`, in a transaction or not).
    pub fn client(&self) -> Client {
        Client::from_pg(self.pg.clone())
    }

    /// Registers `queue` with the default settings (a host registers its queues at start; a
    /// producer's test that starts none declares them here). Declaring it again changes
    /// nothing.
    pub async fn declare_queue(&self, queue: &str) -> Result<(), Error> {
        self.pg
            .register_queue(RegisterQueueParams::new(queue))
            .await?;
        Ok(())
    }

    /// Every unfinished item of `queue` (available, scheduled or running), whole, oldest
    /// first.
    pub async fn unfinished(&self, queue: &str) -> Result<Vec<WorkDetail>, Error> {
        let filter = WorkFilter::new()
            .queue(queue)
            .state(WorkState::Available)
            .state(WorkState::Scheduled)
            .state(WorkState::Running);
        let mut items = Vec::new();
        for summary in self.list_all(filter).await?.into_iter().rev() {
            match self.pg.get_work(GetWorkParams { id: summary.id }).await {
                Ok(got) => items.push(got.item),
                // Finished and pruned since the list: no longer unfinished.
                Err(workpump_coordinator::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(items)
    }

    /// The payloads of the unfinished items of `T`'s kind in `T`'s queue, oldest first.
    ///
    /// (The kind is matched here, item by item: `list_work` filters by queue and state.)
    pub async fn enqueued<T: JobArgs + DeserializeOwned>(&self) -> Result<Vec<T>, Error> {
        self.unfinished(T::QUEUE)
            .await?
            .into_iter()
            .filter(|d| d.kind.as_deref() == Some(T::KIND))
            .map(|d| decode::<T>(&d))
            .collect()
    }

    /// Asserts that an unfinished item of `T`'s kind in `T`'s queue has exactly `expected`'s
    /// payload (compared as JSON), and returns it. Panics otherwise, listing every unfinished
    /// item of the queue.
    pub async fn assert_enqueued<T: JobArgs + Serialize>(&self, expected: &T) -> WorkDetail {
        let want = serde_json::to_value(expected).unwrap_or_else(|e| {
            panic!(
                "assert_enqueued: the expected {} does not serialize to JSON: {e}",
                std::any::type_name::<T>()
            )
        });
        let items = self.unfinished_for_assert::<T>("assert_enqueued").await;
        match items
            .iter()
            .find(|d| d.kind.as_deref() == Some(T::KIND) && d.payload == want)
        {
            Some(found) => found.clone(),
            None => panic!(
                "assert_enqueued: no unfinished item of kind {:?} in queue {:?} has the payload {want}; {}",
                T::KIND,
                T::QUEUE,
                listing(T::QUEUE, &items)
            ),
        }
    }

    /// Asserts that an unfinished item of `T`'s kind in `T`'s queue has a payload for which
    /// `matches` says yes, and returns it. Panics otherwise, listing every unfinished item of
    /// the queue.
    pub async fn assert_enqueued_where<T: JobArgs + DeserializeOwned>(
        &self,
        matches: impl Fn(&T) -> bool,
    ) -> WorkDetail {
        let items = self
            .unfinished_for_assert::<T>("assert_enqueued_where")
            .await;
        let found = items.iter().find(|d| {
            d.kind.as_deref() == Some(T::KIND) && decode::<T>(d).is_ok_and(|t| matches(&t))
        });
        match found {
            Some(found) => found.clone(),
            None => panic!(
                "assert_enqueued_where: no unfinished item of kind {:?} in queue {:?} matches; {}",
                T::KIND,
                T::QUEUE,
                listing(T::QUEUE, &items)
            ),
        }
    }

    /// Asserts that no unfinished item of `T`'s kind is in `T`'s queue. Panics otherwise,
    /// listing every unfinished item of the queue.
    pub async fn assert_not_enqueued<T: JobArgs>(&self) {
        let items = self.unfinished_for_assert::<T>("assert_not_enqueued").await;
        if items.iter().any(|d| d.kind.as_deref() == Some(T::KIND)) {
            panic!(
                "assert_not_enqueued: queue {:?} holds unfinished items of kind {:?}; {}",
                T::QUEUE,
                T::KIND,
                listing(T::QUEUE, &items)
            );
        }
    }

    /// Makes every scheduled item of `queue` (delayed ones, and retries waiting out their
    /// backoff) available and due now, through the store's `run_now` action (the store's
    /// clock: run_at becomes its now); returns how many. Attempts and history are unchanged.
    pub async fn run_now(&self, queue: &str) -> Result<u64, Error> {
        let filter = WorkFilter::new().queue(queue).state(WorkState::Scheduled);
        let totals = self
            .pg
            .bulk_work_matching_all(BulkWorkMatchingParams::new(BulkAction::RunNow, filter))
            .await?;
        Ok(totals.applied)
    }

    /// Runs `queue`'s due items through the handlers of [`jobs`](Self::jobs) until none is
    /// left, and says how they ended. Await it, or set [`Drain::with_scheduled`] and
    /// [`Drain::timeout`] first.
    ///
    /// The items run through the real claim path — a host started for the drain on this
    /// kit's store, claiming from `queue` only: leases, fences, retries with backoff and
    /// outcome writes are production's. Items its handlers enqueue into `queue` run too.
    /// The drain ends when the queue has nothing available, nothing running and nothing
    /// scheduled that is due; an item retried into the future is left (so a drain ends):
    /// drain again with `with_scheduled(true)` to run it.
    pub fn drain(&self, queue: &str) -> Drain<'_> {
        Drain {
            kit: self,
            queue: queue.to_owned(),
            with_scheduled: false,
            timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    async fn unfinished_for_assert<T: JobArgs>(&self, what: &str) -> Vec<WorkDetail> {
        self.unfinished(T::QUEUE).await.unwrap_or_else(|e| {
            panic!(
                "{what}: reading the unfinished items of queue {:?}: {e}",
                T::QUEUE
            )
        })
    }

    /// Every item `filter` matches, newest first.
    async fn list_all(&self, filter: WorkFilter) -> Result<Vec<WorkSummary>, Error> {
        let mut items = Vec::new();
        let mut cursor = None;
        loop {
            let page = self
                .pg
                .list_work(ListWorkParams {
                    filter: filter.clone(),
                    cursor,
                    page_size: Some(MAX_PAGE_SIZE),
                })
                .await?;
            items.extend(page.items);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(items),
            }
        }
    }
}

fn decode<T: JobArgs + DeserializeOwned>(d: &WorkDetail) -> Result<T, Error> {
    serde_json::from_value(d.payload.clone()).map_err(|source| Error::Decode {
        id: d.id,
        kind: T::KIND.to_owned(),
        ty: std::any::type_name::<T>(),
        source,
    })
}

/// What an assertion's failure lists: every unfinished item of the queue.
fn listing(queue: &str, items: &[WorkDetail]) -> String {
    if items.is_empty() {
        return format!("queue {queue:?} holds no unfinished item");
    }
    let mut out = format!("queue {queue:?} holds {} unfinished item(s):", items.len());
    for d in items {
        let kind = match &d.kind {
            Some(k) => format!("kind {k:?}"),
            None => "untyped".to_owned(),
        };
        out.push_str(&format!(
            "\n  item {}: {kind}, {}, run_at {}, payload {}",
            d.id,
            d.state.as_str(),
            d.run_at.to_rfc3339(),
            d.payload
        ));
    }
    out
}

/// A drain of one queue ([`TestKit::drain`]); await it.
#[must_use = "a drain does nothing until awaited"]
pub struct Drain<'a> {
    kit: &'a TestKit,
    queue: String,
    with_scheduled: bool,
    timeout: Duration,
}

impl Drain<'_> {
    /// First make the queue's scheduled items due ([`TestKit::run_now`]), so delayed items
    /// and retries waiting out their backoff run too. Those retried during this drain are
    /// scheduled anew and left. **Default: false.**
    pub fn with_scheduled(mut self, yes: bool) -> Self {
        self.with_scheduled = yes;
        self
    }

    /// How long the drain may run before it gives up with [`Error::Timeout`], naming what
    /// was left. **Default: 30 s.**
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the drain (what awaiting it does).
    pub async fn run(self) -> Result<DrainCounts, Error> {
        let Drain {
            kit,
            queue,
            with_scheduled,
            timeout,
        } = self;
        let register = kit
            .jobs
            .clone()
            .ok_or_else(|| Error::NoJobs(queue.clone()))?;
        if with_scheduled {
            kit.run_now(&queue).await?;
        }
        let overview = kit
            .pg
            .queue_overview(QueueOverviewParams::default())
            .await?;
        if overview.get(&queue).is_some_and(|q| q.paused) {
            return Err(Error::Paused(queue));
        }
        let before = Snapshot::take(kit, &queue).await?;

        let served: Arc<Mutex<Vec<String>>> = Arc::default();
        let host = {
            let served = served.clone();
            let only = queue.clone();
            let schema = kit.pg.schema().to_owned();
            register(Host::builder())
                .pool(kit.pg.pool().clone())
                .configure(move |c| {
                    c.schema = schema;
                    c.metrics.enabled = false;
                    c.claim.enabled = true;
                    // Tight polling: a retry made due, or an item whose wake was missed, is
                    // seen within 100 ms.
                    c.claim.poll_base_ms = 10;
                    c.claim.poll_max_ms = 100;
                    c.claim.notify_healthy_base_ms = None;
                })
                .claim_worker(move |ctx| {
                    let handlers = ctx.handlers();
                    *served.lock().unwrap_or_else(|p| p.into_inner()) =
                        handlers.queues().map(|(q, _)| q.to_owned()).collect();
                    let worker = ClaimWorker::new(
                        ctx.coordinator(),
                        ctx.pg(),
                        ctx.lease_tracker()
                            .expect("the host builds the lease slot before the claim slot"),
                        ctx.identity(),
                        handlers.retain_queues(|q| q == only),
                        ctx.claim_config(),
                    );
                    if worker.claims() {
                        ctx.report_claim_status(worker.status());
                    }
                    let waker = worker.waker();
                    ctx.report_wake(move |q| waker.wake(q));
                    Arc::new(worker) as Arc<dyn Worker>
                })
                // Periodic jobs would keep feeding the queue: none in a drain.
                .scheduler_worker(|_ctx| Arc::new(Idle) as Arc<dyn Worker>)
                .start()
                .await
                .map_err(Error::Host)?
        };
        let registered = served.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let result = if registered.contains(&queue) {
            wait_until_done(kit, &queue, timeout).await
        } else {
            Err(Error::NoHandler {
                queue: queue.clone(),
                registered: if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                },
            })
        };
        host.shutdown();
        let stopped = host.stopped().await;
        result?;
        stopped.map_err(Error::Host)?;
        before.count(kit, &queue).await
    }
}

impl<'a> IntoFuture for Drain<'a> {
    type Output = Result<DrainCounts, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Waits until `queue` has nothing available, running or due, or `timeout` passes.
async fn wait_until_done(kit: &TestKit, queue: &str, timeout: Duration) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = left_in(kit, queue).await?;
        if left.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                queue: queue.to_owned(),
                timeout,
                left: left.join(", "),
            });
        }
        tokio::time::sleep(DRAIN_CHECK).await;
    }
}

/// What keeps `queue` from being drained, in words (empty: nothing).
async fn left_in(kit: &TestKit, queue: &str) -> Result<Vec<String>, Error> {
    let overview = kit
        .pg
        .queue_overview(QueueOverviewParams::default())
        .await?;
    let Some(q) = overview.get(queue) else {
        return Ok(Vec::new());
    };
    let mut left = Vec::new();
    if q.available > 0 {
        left.push(format!("{} available", q.available));
    }
    if q.running > 0 {
        left.push(format!("{} running", q.running));
    }
    if q.scheduled > 0 {
        if let Some(now) = overview.now {
            let scheduled = kit
                .list_all(WorkFilter::new().queue(queue).state(WorkState::Scheduled))
                .await?;
            let due = scheduled.iter().filter(|s| s.run_at <= now).count();
            if due > 0 {
                left.push(format!("{due} scheduled and due"));
            }
        }
    }
    Ok(left)
}

/// The queue before a drain: which items were finished, and how many attempts each unfinished
/// one had started. What the drain ran is what changed (no clock needed).
struct Snapshot {
    finished: HashSet<WorkId>,
    attempts: HashMap<WorkId, i32>,
}

impl Snapshot {
    async fn take(kit: &TestKit, queue: &str) -> Result<Self, Error> {
        let mut finished = HashSet::new();
        let mut attempts = HashMap::new();
        for item in kit.list_all(WorkFilter::new().queue(queue)).await? {
            if item.finished_at.is_some() {
                finished.insert(item.id);
            } else {
                attempts.insert(item.id, item.attempt);
            }
        }
        Ok(Snapshot { finished, attempts })
    }

    /// Counts the items of `queue` the drain ran: those finished since the snapshot, by their
    /// state, and the waiting ones that started an attempt since (so it failed, and they wait
    /// for their retry).
    async fn count(&self, kit: &TestKit, queue: &str) -> Result<DrainCounts, Error> {
        let mut counts = DrainCounts::default();
        for item in kit.list_all(WorkFilter::new().queue(queue)).await? {
            match item.state {
                _ if self.finished.contains(&item.id) => {}
                WorkState::Completed => counts.completed += 1,
                WorkState::Dead => counts.dead += 1,
                WorkState::Cancelled => counts.cancelled += 1,
                WorkState::Available | WorkState::Scheduled
                    if item.attempt > self.attempts.get(&item.id).copied().unwrap_or(0) =>
                {
                    counts.retried += 1
                }
                _ => {}
            }
        }
        Ok(counts)
    }
}

/// A worker for the scheduler slot that schedules nothing.
struct Idle;

#[async_trait]
impl Worker for Idle {
    fn name(&self) -> &str {
        "scheduler"
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        shutdown.cancelled().await;
        Ok(())
    }
}
