//! The operator's reads and the dashboard's cost.
//!
//! `ops`: a store of N items (1 000 000 in full mode) shaped like a long-running service's —
//! 90 % completed over the last two hours, 2 % dead with an error, the rest waiting — then
//! each read the dashboard and `workpump` make, timed 15 times (median and worst): a page of
//! 100 items unfiltered, a page of dead letters of the queue, a page filtered by error text,
//! one item, the queue overview, the instances.
//!
//! `dashboard`: the drain run alternately without and with the dashboard open beside it (the
//! real router on the drain's database; four pages open — the queues, the queue, the items,
//! the dead letters — each reloading at the default refresh, 5 s), in pairs run back to back;
//! the figure is the median of the pairs' ratios.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use workpump_coordinator::{
    GetWorkParams, ListInstancesParams, ListWorkParams, Operations, QueueOverviewParams,
    WorkFilter, WorkState,
};

use super::drain::{self, Pairs, Shape};
use super::setup::{self, BenchDb, QUEUE, SCHEMA};
use super::{BenchResult, Ctx};

/// How often the stand-in browser reloads each page: the dashboard's default.
const REFRESH: Duration = Duration::from_secs(5);

/// Times each read is made.
const SAMPLES: usize = 15;

/// One read's timings, ms.
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    pub(crate) name: &'static str,
    pub(crate) median_ms: f64,
    pub(crate) max_ms: f64,
}

/// What `ops` measured.
#[derive(Clone, Debug)]
pub(crate) struct OpsTimings {
    pub(crate) items: usize,
    pub(crate) timings: Vec<Timing>,
}

impl OpsTimings {
    pub(crate) fn get(&self, name: &str) -> Option<&Timing> {
        self.timings.iter().find(|t| t.name == name)
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "items": self.items,
            "reads": self.timings.iter().map(|t| json!({
                "read": t.name, "median_ms": t.median_ms, "max_ms": t.max_ms,
            })).collect::<Vec<_>>(),
        })
    }
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<OpsTimings> {
    let db = ctx.create_db("ops").await?;
    let result = measure(ctx, &db).await;
    db.drop_now().await?;
    result
}

async fn measure(ctx: &Ctx, db: &BenchDb) -> BenchResult<OpsTimings> {
    let items = ctx.plan.ops_items;
    db.set_paused(true).await?;
    // The history's partitions, as a store that has been swept has them (24 h retention:
    // now's hour and three ahead), so that the reads below go through them: the completed
    // items of the last hour land in now's partition, the older ones in the default one.
    sqlx::query(&format!(
        "{} SELECT count(*) FROM {SCHEMA}.prune_finished('24 hours', '7 days', 1)",
        setup::MARK
    ))
    .execute(db.pool())
    .await?;
    drain::fill(db, items, json!({ "kind": "noop" })).await?;
    // 90 % completed over the last two hours, 2 % dead with an error; the rest stay
    // available. Written behind the functions' backs: this only shapes the table.
    sqlx::raw_sql(&format!(
        "{mark} WITH done AS (DELETE FROM {SCHEMA}.work WHERE id % 100 >= 10 RETURNING *)
         INSERT INTO {SCHEMA}.work_history
             (id, queue, priority, attempt, max_attempts, run_at, claim_token, renewals,
              cancel_requested, kind, payload, metadata, errors, created_at, finished_at)
         SELECT id, queue, priority, 1, max_attempts, run_at,
                nextval('{SCHEMA}.claim_token_seq'), 0, false, kind, payload, metadata, errors,
                created_at, now() - (id % 7200) * interval '1 second'
         FROM done;
         {mark} UPDATE {SCHEMA}.work SET state = 'dead', attempt = 1,
                finished_at = now() - (id % 7200) * interval '1 second',
                errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(),
                    'instance', NULL, 'kind', 'rejected',
                    'error', CASE WHEN id % 1000 = 0 THEN 'upstream timeout after 30 s'
                                  ELSE 'invalid address' END))
         WHERE id % 100 < 2;",
        mark = setup::MARK
    ))
    .execute(db.pool())
    .await?;
    db.settle().await?;

    let ops = db.coordinator();
    let some_id: i64 = sqlx::query_scalar(&format!(
        "{} SELECT id FROM {SCHEMA}.work_all WHERE state = 'dead' ORDER BY id LIMIT 1",
        setup::MARK
    ))
    .fetch_one(db.pool())
    .await?;
    let page = |filter: WorkFilter| ListWorkParams {
        filter,
        cursor: None,
        page_size: Some(100),
    };
    let mut timings = Vec::new();
    timings.push(
        time("list_work: 100 items", || {
            ops.list_work(page(WorkFilter::new()))
        })
        .await?,
    );
    timings.push(
        time("list_work: 100 dead letters of the queue", || {
            ops.list_work(page(WorkFilter::new().queue(QUEUE).state(WorkState::Dead)))
        })
        .await?,
    );
    timings.push(
        time("list_work: 100 by error text", || {
            ops.list_work(page(WorkFilter::new().error_contains("timeout")))
        })
        .await?,
    );
    timings.push(time("get_work", || ops.get_work(GetWorkParams { id: some_id })).await?);
    timings.push(
        time("queue_overview", || {
            ops.queue_overview(QueueOverviewParams {})
        })
        .await?,
    );
    timings.push(
        time("list_instances", || {
            ops.list_instances(ListInstancesParams {})
        })
        .await?,
    );
    for t in &timings {
        eprintln!(
            "bench: ops on {items} items: {}: median {:.1} ms, max {:.1} ms",
            t.name, t.median_ms, t.max_ms
        );
    }
    Ok(OpsTimings { items, timings })
}

async fn time<F, Fut, T>(name: &'static str, mut call: F) -> BenchResult<Timing>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = workpump_coordinator::Result<T>>,
{
    // One call first, not timed: the plan cached and the pages read once.
    call().await?;
    let mut ms = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let began = Instant::now();
        call().await?;
        ms.push(began.elapsed().as_secs_f64() * 1_000.0);
    }
    ms.sort_by(f64::total_cmp);
    Ok(Timing {
        name,
        median_ms: round1(ms[ms.len() / 2]),
        max_ms: round1(ms[ms.len() - 1]),
    })
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The drain with and without the dashboard beside it.
#[derive(Clone, Debug)]
pub(crate) struct DashboardCost {
    pub(crate) workers: usize,
    /// Without (base) and with (variant) the dashboard.
    pub(crate) pairs: Pairs,
    /// Pages the dashboard served during the drains beside it.
    pub(crate) pages: u64,
}

impl DashboardCost {
    /// The median of each pair's ratio (with over without): the figure.
    pub(crate) fn ratio(&self) -> f64 {
        self.pairs.ratio()
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "without_items_per_s": self.pairs.base.iter().map(|r| r.rate.round()).collect::<Vec<_>>(),
            "with_items_per_s": self.pairs.variant.iter().map(|r| r.rate.round()).collect::<Vec<_>>(),
            "pages_served": self.pages,
            "ratio_of_medians": (self.pairs.ratio_of_medians() * 1000.0).round() / 1000.0,
            "median_pair_ratio": (self.ratio() * 1000.0).round() / 1000.0,
        })
    }
}

pub(crate) async fn dashboard_cost(ctx: &Ctx, workers: usize) -> BenchResult<DashboardCost> {
    let mut cost = DashboardCost {
        workers,
        pairs: Pairs::default(),
        pages: 0,
    };
    let shape = Shape::plain(workers, ctx.plan.drain_items);
    for pair in 0..ctx.plan.dashboard_pairs {
        for beside in Pairs::order(pair) {
            let pages = Arc::new(AtomicU64::new(0));
            let run = drain::run_once_beside(ctx, &shape, |url| {
                if beside {
                    Some(open_dashboard(url.to_owned(), pages.clone()))
                } else {
                    None
                }
            })
            .await?;
            eprintln!(
                "bench: drain, {workers} worker(s), {} the dashboard: {:.0} items/s",
                if beside { "with" } else { "without" },
                run.rate
            );
            if beside {
                cost.pages += pages.load(Ordering::Relaxed);
            }
            cost.pairs.push(beside, run);
        }
    }
    if cost.pages == 0 {
        return Err("the dashboard served no page beside the drain: nothing was measured".into());
    }
    Ok(cost)
}

/// What runs beside a drain until it is dropped.
pub(crate) struct Beside {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Beside {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The dashboard on `url`'s store, served on the loopback, and a browser stand-in: four pages
/// open (the queues, the queue, its items, the dead letters), each reloaded at the default
/// refresh interval, counting the pages served. The first load is at once.
fn open_dashboard(url: String, pages: Arc<AtomicU64>) -> Beside {
    let stop = Arc::new(AtomicBool::new(false));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let address = listener.local_addr().expect("its address");
    listener.set_nonblocking(true).expect("non-blocking");
    let server = tokio::spawn(async move {
        let Ok(store) = workpump_coordinator::PgCoordinator::connect_lazy(&url, SCHEMA, 2) else {
            return;
        };
        let Ok(app) = workpump_dashboard::router(
            Arc::new(store),
            workpump_dashboard::DashboardConfig::default(),
        ) else {
            return;
        };
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        let _ = axum::serve(listener, app).await;
    });
    let flag = stop.clone();
    let poller = tokio::task::spawn_blocking(move || {
        let paths = ["/", &format!("/queues/{QUEUE}"), "/items", "/dead"].map(str::to_owned);
        while !flag.load(Ordering::Relaxed) {
            let began = Instant::now();
            for path in &paths {
                if get(address, path) {
                    pages.fetch_add(1, Ordering::Relaxed);
                }
            }
            while !flag.load(Ordering::Relaxed) && began.elapsed() < REFRESH {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    Beside {
        stop,
        tasks: vec![server, poller],
    }
}

/// One `GET` over HTTP/1.1; true when the answer was 200.
fn get(address: std::net::SocketAddr, path: &str) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    response.starts_with(b"HTTP/1.1 200")
}
