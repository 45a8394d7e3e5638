//! Bad input at the coordinator's seam, against PostgreSQL (one fresh database per test,
//! reused across that test's cases) and against the in-memory fake: arbitrary queue names,
//! payloads, batch sizes, priorities, business times, delays, leases, liveness cutoffs,
//! unique keys, failure messages, heartbeat metadata and schema names.
//!
//! The rule every property checks: a call either succeeds (the input is valid, and then it
//! does what it says) or is refused with an error that names the problem — never a panic,
//! never an opaque database error — and a refusal writes nothing. The oracles restate the
//! documented limits independently of `validate.rs`.
//!
//! Properties run on proptest's runner inside one runtime per test; PostgreSQL takes fewer
//! cases than the fake. Each bug the properties found has a deterministic regression test at
//! the end of the file.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestCaseResult, TestRunner};
use serde_json::{json, Number, Value};
use sqlx::postgres::PgPool;
use workpump_coordinator::conformance::ErrorEntry;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::*;
use workpump_testdb::TestDatabase;

// ---------------------------------------------------------------------------------------------
// The stores and the runner

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Postgres,
    InMemory,
}

/// Cases per store: PostgreSQL round trips cost milliseconds, the fake microseconds.
#[derive(Clone, Copy)]
struct Cases {
    pg: u32,
    fake: u32,
}

const CASES: Cases = Cases { pg: 40, fake: 256 };

/// A coordinator and what a test needs to look behind it.
#[derive(Clone)]
struct Store {
    kind: Kind,
    c: Arc<dyn WorkCoordinator>,
    /// The operator's calls on the same store.
    ops: Arc<dyn Operations>,
    pg: Option<Pg>,
    fake: Option<FakeCoordinator>,
    next: Arc<AtomicU64>,
}

#[derive(Clone)]
struct Pg {
    pool: PgPool,
    /// Dropped with the last clone: the database goes with it.
    _db: Arc<TestDatabase>,
}

/// What a row looks like, for assertions.
#[derive(Debug)]
struct RowView {
    state: WorkState,
    renewals: i32,
    errors: Vec<ErrorEntry>,
}

/// Rows per table, to see that a refusal wrote nothing.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    work: u64,
    queues: u64,
}

const LEASE: Duration = Duration::from_secs(60);
const STALE: Duration = Duration::from_secs(30);

impl Store {
    async fn open(kind: Kind) -> Store {
        match kind {
            Kind::Postgres => {
                let FreshStore {
                    coordinator,
                    pool,
                    db,
                } = fresh_store().await;
                Store {
                    kind,
                    c: Arc::new(coordinator.clone()),
                    ops: Arc::new(coordinator),
                    pg: Some(Pg {
                        pool,
                        _db: Arc::new(db),
                    }),
                    fake: None,
                    next: Arc::default(),
                }
            }
            Kind::InMemory => {
                let fake = FakeCoordinator::new();
                Store {
                    kind,
                    c: Arc::new(fake.clone()),
                    ops: Arc::new(fake.clone()),
                    pg: None,
                    fake: Some(fake),
                    next: Arc::default(),
                }
            }
        }
    }

    async fn close(self) {
        if let Some(pg) = self.pg {
            pg.pool.close().await;
        }
    }

    async fn counts(&self) -> Counts {
        match (&self.pg, &self.fake) {
            (Some(pg), _) => {
                let (work, queues): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM workpump.work_all), (SELECT count(*) FROM workpump.queues)",
                )
                .fetch_one(&pg.pool)
                .await
                .expect("count rows");
                Counts {
                    work: work as u64,
                    queues: queues as u64,
                }
            }
            (None, Some(fake)) => {
                let depths = fake
                    .queue_depth(QueueDepthParams::default())
                    .await
                    .expect("queue depth");
                let queues: HashSet<String> = depths.depths.into_iter().map(|d| d.queue).collect();
                Counts {
                    work: fake.work_rows().len() as u64,
                    queues: queues.len() as u64,
                }
            }
            (None, None) => unreachable!("a store is PostgreSQL or the fake"),
        }
    }

    async fn row(&self, id: WorkId) -> Option<RowView> {
        match (&self.pg, &self.fake) {
            (Some(pg), _) => {
                let row: Option<(String, i32, Value)> = sqlx::query_as(
                    "SELECT state::text, renewals, errors FROM workpump.work_all WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(&pg.pool)
                .await
                .expect("read a row");
                row.map(|(state, renewals, errors)| RowView {
                    state: WorkState::parse(&state).expect("a known state"),
                    renewals,
                    errors: errors
                        .as_array()
                        .expect("errors is an array")
                        .iter()
                        .map(ErrorEntry::from_json)
                        .collect(),
                })
            }
            (None, Some(fake)) => fake.work_row(id).map(|r| RowView {
                state: r.state,
                renewals: r.renewals,
                errors: r.errors,
            }),
            (None, None) => unreachable!("a store is PostgreSQL or the fake"),
        }
    }

    async fn instance_registered(&self, instance: InstanceId) -> bool {
        match (&self.pg, &self.fake) {
            (Some(pg), _) => sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM workpump.instances WHERE instance_id = $1)",
            )
            .bind(instance.0)
            .fetch_one(&pg.pool)
            .await
            .expect("read the instance"),
            (None, Some(fake)) => fake.instance_registered(instance),
            (None, None) => unreachable!("a store is PostgreSQL or the fake"),
        }
    }

    /// A queue of its own for one case, so cases never see each other's items.
    async fn fresh_queue(&self) -> String {
        let name = format!("q{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.c
            .register_queue(RegisterQueueParams::new(&name))
            .await
            .expect("register a queue");
        name
    }

    async fn instance(&self) -> InstanceId {
        let me = InstanceId::new();
        self.c
            .record_heartbeat(heartbeat(me, json!({})))
            .await
            .expect("record a heartbeat");
        me
    }

    async fn claim(&self, me: InstanceId, queue: &str) -> Vec<ClaimedWork> {
        self.c
            .claim_work(ClaimWorkParams {
                instance: me,
                queues: vec![queue.to_owned()],
                max_items: MAX_CLAIM_BATCH,
                lease: LEASE,
                async_commit: false,
            })
            .await
            .expect("claim")
            .items
    }

    /// A fresh queue, an instance, and `n` items claimed by it.
    async fn claimed(&self, n: usize) -> (InstanceId, String, Vec<ClaimedWork>) {
        let queue = self.fresh_queue().await;
        let me = self.instance().await;
        let items = (0..n).map(|i| NewWork::new(&queue, json!(i))).collect();
        self.c
            .enqueue_work(EnqueueWorkParams { items })
            .await
            .expect("enqueue");
        let claimed = self.claim(me, &queue).await;
        assert_eq!(claimed.len(), n, "every item claimed");
        (me, queue, claimed)
    }
}

fn heartbeat(instance: InstanceId, metadata: Value) -> RecordHeartbeatParams {
    RecordHeartbeatParams {
        instance,
        host: "bad-input".into(),
        metadata,
        stale_after: STALE,
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs `property` on `cases` values of `strategy` against one store of `kind`.
fn check<S, F, Fut>(kind: Kind, cases: Cases, strategy: S, property: F)
where
    S: Strategy,
    F: Fn(Store, S::Value) -> Fut,
    Fut: Future<Output = TestCaseResult>,
{
    let rt = runtime();
    let store = rt.block_on(Store::open(kind));
    let config = Config {
        cases: match kind {
            Kind::Postgres => cases.pg,
            Kind::InMemory => cases.fake,
        },
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |value| {
        rt.block_on(property(store.clone(), value))
    });
    rt.block_on(store.close());
    if let Err(e) = result {
        panic!("{kind:?}: {e}");
    }
}

/// Runs one deterministic case against one store of `kind`.
fn once<F, Fut>(kind: Kind, case: F)
where
    F: FnOnce(Store) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = runtime();
    let store = rt.block_on(Store::open(kind));
    rt.block_on(case(store.clone()));
    rt.block_on(store.close());
}

/// A property for both stores: `mod $name { on_postgresql, in_memory }`.
macro_rules! property {
    ($name:ident, $cases:expr, $strategy:expr, $property:path) => {
        mod $name {
            use super::*;

            #[test]
            fn on_postgresql() {
                check(Kind::Postgres, $cases, $strategy, $property);
            }

            #[test]
            fn in_memory() {
                check(Kind::InMemory, $cases, $strategy, $property);
            }
        }
    };
}

/// A deterministic case for both stores.
macro_rules! regression {
    ($name:ident, $case:path) => {
        mod $name {
            use super::*;

            #[test]
            fn on_postgresql() {
                once(Kind::Postgres, $case);
            }

            #[test]
            fn in_memory() {
                once(Kind::InMemory, $case);
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Outcome helpers

/// `r` is an `InvalidArgument` whose message contains every one of `needles`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T>, needles: &[&str]) -> TestCaseResult {
    match r {
        Err(Error::InvalidArgument(m)) if needles.iter().all(|n| m.contains(n)) => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "{what}: expected an invalid argument naming {needles:?}, got {other:?}"
        ))),
    }
}

/// `r` succeeded.
fn accepted<T: std::fmt::Debug>(what: &str, r: Result<T>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: expected success, got {e:?}")))
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> TestCaseResult {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

async fn unchanged(store: &Store, before: &Counts, what: &str) -> TestCaseResult {
    let after = store.counts().await;
    ensure(after == *before, || {
        format!("{what}: a refusal wrote something: {before:?} before, {after:?} after")
    })
}

// ---------------------------------------------------------------------------------------------
// Oracles: the documented limits, restated

fn queue_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(c))
}

fn schema_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 40
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        && !name.starts_with("pg_")
        && name != "information_schema"
}

/// The deepest nesting of arrays and objects (a scalar is 0).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn largest_number(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().map_or(0.0, f64::abs),
        Value::Array(items) => items.iter().map(largest_number).fold(0.0, f64::max),
        Value::Object(map) => map.values().map(largest_number).fold(0.0, f64::max),
        _ => 0.0,
    }
}

/// Whether a payload (or checkpoint, or heartbeat metadata) is within the documented limits.
fn payload_ok(v: &Value) -> bool {
    depth(v) <= MAX_PAYLOAD_DEPTH
        && !has_nul(v)
        && largest_number(v) <= 1e308
        && serde_json::to_string(v).expect("serialisable").len() <= MAX_PAYLOAD_BYTES
}

/// JSON equality. With `exact_numbers` false, numbers compare by value within the precision
/// of serde_json's default float parser (a few ulps; PostgreSQL prints jsonb numbers in plain
/// decimal, e.g. 1e16 as 10000000000000000, which serde_json reads back as an integer, and
/// parses long decimals without the `float_roundtrip` feature, e.g. 123456789.12345679 back
/// as 123456789.1234568).
fn same_json(a: &Value, b: &Value, exact_numbers: bool) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if exact_numbers || (x.is_f64() == y.is_f64() && !x.is_f64()) {
                return x == y;
            }
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y
                || (x - y).abs() <= 8.0 * f64::EPSILON * x.abs().max(y.abs())
                || (x - y).abs() < 1e-300
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y, exact_numbers))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w, exact_numbers)))
        }
        _ => a == b,
    }
}

/// Unwinds a deeply nested value by hand (serde_json's drop recurses).
fn flatten_drop(mut v: Value) {
    loop {
        v = match v {
            Value::Array(mut items) => match items.pop() {
                Some(inner) => inner,
                None => return,
            },
            Value::Object(map) => match map.into_iter().next() {
                Some((_, inner)) => inner,
                None => return,
            },
            _ => return,
        };
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies

/// Pieces that break naive quoting, escaping or parsing.
const NASTY: &[&str] = &[
    "'",
    "\"",
    "\\",
    ";",
    "--",
    "/*",
    "*/",
    "\0",
    " ",
    "\n",
    "\t",
    "\r",
    "é",
    "日本",
    "%",
    "$1",
    "$$",
    "' OR '1'='1",
    "'; DROP TABLE workpump.work; --",
    "\u{202e}",
    "\u{feff}",
    "%s%L%I",
    "\\x00",
    "\\u0000",
    "\u{10ffff}",
    "💥",
    "{}",
    "[]",
    ",",
    "(",
    ")",
    "*",
    "?",
    "&",
    "|",
];

fn any_text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => vec(any::<char>(), 0..max).prop_map(String::from_iter),
        2 => "[ -~]{0,40}",
        1 => (
            "[A-Za-z0-9_]{0,8}",
            prop::sample::select(NASTY),
            "[A-Za-z0-9_]{0,8}"
        )
            .prop_map(|(a, n, b)| format!("{a}{n}{b}")),
    ]
}

fn queue_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}",
        2 => "[A-Za-z0-9_.:-]{0,131}",
        2 => vec(any::<char>(), 0..300).prop_map(String::from_iter),
        2 => (
            "[A-Za-z0-9]{1,6}",
            prop::sample::select(NASTY),
            "[A-Za-z0-9_.:-]{0,6}"
        )
            .prop_map(|(a, n, b)| format!("{a}{n}{b}")),
        1 => Just(String::new()),
        1 => Just("x".repeat(128)),
        1 => Just("x".repeat(129)),
    ]
}

fn special_float() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![
        0.0,
        -0.0,
        1e308,
        -1e308,
        1.0000000000000002e308,
        f64::MAX,
        f64::MIN,
        1.7976931348623155e308,
        f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        f64::EPSILON,
        0.1,
        1e16,
        1e21,
        123456789.12345679,
        2.5,
        -1.5e300,
    ])
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1]).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        special_float().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        any_text(24).prop_map(Value::String),
        Just(Value::String("x\0y".into())),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(any_text(12), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A scalar nested `levels` deep in arrays or objects (alternating by the flag).
fn nested(levels: usize, leaf: Value, objects: bool) -> Value {
    let mut v = leaf;
    for i in 0..levels {
        v = if objects && i % 2 == 0 {
            json!({ "k": v })
        } else {
            Value::Array(vec![v])
        };
    }
    v
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        2 => prop::sample::select(vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_micros(1),
            Duration::from_millis(1),
            Duration::from_secs(1),
            MAX_LEASE,
            MAX_LEASE + Duration::from_nanos(1),
            MAX_LEASE + Duration::from_micros(1),
            MAX_SCHEDULE_AHEAD,
            MAX_SCHEDULE_AHEAD + Duration::from_nanos(1),
            MAX_SCHEDULE_AHEAD + Duration::from_secs(1),
            Duration::from_secs(u64::MAX / 2),
            Duration::MAX,
        ]),
        1 => (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => (0u64..200 * 366 * 86_400, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => (0u64..3 * 86_400_000_000).prop_map(Duration::from_micros),
    ]
}

fn lease_ok(d: Duration) -> bool {
    d.as_micros() >= 1 && d <= MAX_LEASE
}

fn business_time() -> impl Strategy<Value = DateTime<Utc>> {
    let specials = vec![
        DateTime::<Utc>::MIN_UTC,
        DateTime::<Utc>::MAX_UTC,
        DateTime::<Utc>::UNIX_EPOCH,
        DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::microseconds(1),
        DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::nanoseconds(1),
        Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0)
            .single()
            .expect("year 1"),
        Utc.with_ymd_and_hms(1969, 12, 31, 23, 59, 59)
            .single()
            .expect("1969"),
        Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59)
            .single()
            .expect("9999")
            + chrono::Duration::nanoseconds(999_999_999),
        Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0)
            .single()
            .expect("10000"),
        Utc.with_ymd_and_hms(2000, 2, 29, 12, 0, 0)
            .single()
            .expect("2000"),
    ];
    let (min, max) = (
        DateTime::<Utc>::MIN_UTC.timestamp(),
        DateTime::<Utc>::MAX_UTC.timestamp(),
    );
    prop_oneof![
        1 => prop::sample::select(specials),
        2 => (min..=max, 0u32..1_000_000_000)
            .prop_filter_map("representable", |(s, n)| DateTime::from_timestamp(s, n)),
        2 => (-100_000_000_000i64..400_000_000_000, 0u32..1_000_000_000)
            .prop_filter_map("representable", |(s, n)| DateTime::from_timestamp(s, n)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Queue names

async fn queue_names(store: Store, name: String) -> TestCaseResult {
    let c = &store.c;
    let valid = queue_name_ok(&name);
    let before = store.counts().await;
    let r = c.register_queue(RegisterQueueParams::new(&name)).await;
    if valid {
        accepted("register_queue", r)?;
    } else {
        refused("register_queue", r, &["queue name"])?;
        unchanged(&store, &before, "register_queue").await?;
    }

    let before = store.counts().await;
    let r = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&name, json!({"q": name}))],
        })
        .await;
    if valid {
        accepted("enqueue_work", r)?;
    } else {
        refused("enqueue_work", r, &["item 0", "queue name"])?;
        unchanged(&store, &before, "enqueue_work").await?;
    }

    let me = store.instance().await;
    let r = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec![name.clone()],
            max_items: MAX_CLAIM_BATCH,
            lease: LEASE,
            async_commit: false,
        })
        .await;
    if valid {
        let items = accepted("claim_work", r)?.items;
        ensure(
            !items.is_empty() && items.iter().all(|i| i.queue == name),
            || format!("claim_work of {name:?} returned {items:?}"),
        )?;
    } else {
        refused("claim_work", r, &["queue name"])?;
    }
    Ok(())
}

property!(
    queue_names_are_accepted_only_when_well_formed_and_a_refusal_writes_nothing,
    CASES,
    queue_name(),
    super::queue_names
);

async fn unregistered_queues(store: Store, (name, bad_at): (String, usize)) -> TestCaseResult {
    let known = store.fresh_queue().await;
    let unknown = format!("unregistered-{name}");
    let mut items: Vec<NewWork> = (0..3).map(|i| NewWork::new(&known, json!(i))).collect();
    items.insert(bad_at, NewWork::new(&unknown, json!("lost")));
    let before = store.counts().await;
    let r = store.c.enqueue_work(EnqueueWorkParams { items }).await;
    match r {
        Err(Error::UnknownQueue(q)) if q == unknown => {}
        other => {
            return Err(TestCaseError::fail(format!(
                "expected UnknownQueue({unknown:?}), got {other:?}"
            )))
        }
    }
    unchanged(&store, &before, "enqueue_work to an unknown queue").await
}

property!(
    enqueueing_to_an_unregistered_queue_is_refused_naming_it_and_writes_nothing_of_the_batch,
    CASES,
    ("[A-Za-z0-9_.:-]{0,100}", 0usize..=3),
    super::unregistered_queues
);

// ---------------------------------------------------------------------------------------------
// Payloads

async fn payload_round_trip(store: Store, payload: Value) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let valid = payload_ok(&payload);
    let before = store.counts().await;
    let r = store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, payload.clone())],
        })
        .await;
    if !valid {
        refused("enqueue_work", r, &["item 0", "payload"])?;
        unchanged(&store, &before, "enqueue_work").await?;
        // A batch whose last item is the bad one writes nothing either.
        let r = store
            .c
            .enqueue_work(EnqueueWorkParams {
                items: vec![
                    NewWork::new(&queue, json!("fine")),
                    NewWork::new(&queue, payload.clone()),
                ],
            })
            .await;
        refused("enqueue_work", r, &["item 1", "payload"])?;
        unchanged(&store, &before, "enqueue_work of a batch").await?;
        flatten_drop(payload);
        return Ok(());
    }
    accepted("enqueue_work", r)?;
    let me = store.instance().await;
    let claimed = store.claim(me, &queue).await;
    ensure(claimed.len() == 1, || format!("claimed {claimed:?}"))?;
    let got = &claimed[0].payload;
    ensure(
        same_json(got, &payload, store.kind == Kind::InMemory),
        || format!("payload {payload} came back as {got}"),
    )?;
    // The same value is a valid checkpoint, and comes back with the next claim.
    let fence = claimed[0].fence;
    accepted(
        "checkpoint_work",
        store
            .c
            .checkpoint_work(CheckpointWorkParams {
                instance: me,
                fence,
                checkpoint: payload.clone(),
            })
            .await,
    )?;
    accepted(
        "release_work",
        store
            .c
            .release_work(ReleaseWorkParams {
                instance: me,
                items: vec![fence],
                consume_attempt: false,
            })
            .await,
    )?;
    let again = store.claim(me, &queue).await;
    let checkpoint = again.first().and_then(|i| i.checkpoint.clone());
    let expected = (!payload.is_null()).then_some(&payload);
    ensure(
        match (&checkpoint, expected) {
            (Some(c), Some(p)) => same_json(c, p, store.kind == Kind::InMemory),
            (None, None) => true,
            _ => false,
        },
        || format!("checkpoint {payload} came back as {checkpoint:?}"),
    )?;
    flatten_drop(payload);
    Ok(())
}

property!(
    payloads_round_trip_through_a_claim_or_are_refused_naming_the_item,
    CASES,
    json_value(),
    super::payload_round_trip
);

property!(
    payloads_nested_up_to_the_depth_limit_round_trip_and_deeper_ones_are_refused,
    Cases { pg: 24, fake: 128 },
    (
        prop_oneof![
            1usize..=200,
            (MAX_PAYLOAD_DEPTH - 2)..=(MAX_PAYLOAD_DEPTH + 2)
        ],
        json_leaf(),
        any::<bool>()
    )
        .prop_map(|(levels, leaf, objects)| nested(levels, leaf, objects)),
    super::payload_round_trip
);

/// A string payload whose JSON text is near the size limit; `escaped` spends six bytes of
/// JSON text per character (`\u0001`), so the limit counts JSON bytes, not characters.
fn sized_payload((offset, escaped): (i64, bool)) -> Value {
    let target = (MAX_PAYLOAD_BYTES as i64 + offset) as usize - 2; // the quotes
    if escaped {
        let n = target / 6;
        Value::String(format!(
            "{}{}",
            "\u{1}".repeat(n),
            "x".repeat(target - 6 * n)
        ))
    } else {
        Value::String("é".repeat(target / 2) + &"x".repeat(target % 2))
    }
}

property!(
    payloads_around_the_size_limit_are_accepted_or_refused_by_their_json_length,
    Cases { pg: 6, fake: 12 },
    (-8i64..=8, any::<bool>()).prop_map(sized_payload),
    super::payload_round_trip
);

// ---------------------------------------------------------------------------------------------
// Batches: one bad item writes nothing

#[derive(Clone, Copy, Debug)]
enum BadItem {
    QueueName,
    UnknownQueue,
    NulPayload,
    TooDeep,
    HugeNumber,
    EmptyUniqueKey,
    LongUniqueKey,
    NulUniqueKey,
    MaxAttempts(i32),
    RunAt1969,
    RunAfterTooLong,
}

async fn one_bad_item(store: Store, (len, at, bad): (usize, usize, BadItem)) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let at = at % len;
    let mut items: Vec<NewWork> = (0..len)
        .map(|i| NewWork::new(&queue, json!({ "i": i })).unique_key(format!("k{i}")))
        .collect();
    let item = &mut items[at];
    let needle = match bad {
        BadItem::QueueName => {
            item.queue = "bad name".into();
            "queue name"
        }
        BadItem::UnknownQueue => {
            item.queue = "never-registered".into();
            "never-registered"
        }
        BadItem::NulPayload => {
            item.payload = json!({ "a": "\0" });
            "NUL"
        }
        BadItem::TooDeep => {
            item.payload = nested(MAX_PAYLOAD_DEPTH + 1, json!(1), false);
            "nested"
        }
        BadItem::HugeNumber => {
            item.payload = json!([f64::MAX]);
            "1e308"
        }
        BadItem::EmptyUniqueKey => {
            item.unique_key = Some(String::new());
            "unique_key"
        }
        BadItem::LongUniqueKey => {
            item.unique_key = Some("k".repeat(MAX_UNIQUE_KEY_BYTES + 1));
            "unique_key"
        }
        BadItem::NulUniqueKey => {
            item.unique_key = Some("a\0b".into());
            "unique_key"
        }
        BadItem::MaxAttempts(m) => {
            item.max_attempts = Some(m);
            "max_attempts"
        }
        BadItem::RunAt1969 => {
            item.schedule =
                Schedule::At(DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::seconds(1));
            "run_at"
        }
        BadItem::RunAfterTooLong => {
            item.schedule = Schedule::After(MAX_SCHEDULE_AHEAD + Duration::from_secs(1));
            "run_after"
        }
    };
    let before = store.counts().await;
    let r = store.c.enqueue_work(EnqueueWorkParams { items }).await;
    match (bad, r) {
        (BadItem::UnknownQueue, Err(Error::UnknownQueue(q))) if q == needle => {}
        (BadItem::UnknownQueue, other) => {
            return Err(TestCaseError::fail(format!(
                "expected UnknownQueue, got {other:?}"
            )))
        }
        (_, r) => refused("enqueue_work", r, &[&format!("item {at}:"), needle])?,
    }
    unchanged(&store, &before, "enqueue_work").await
}

property!(
    a_batch_with_one_bad_item_is_refused_naming_it_and_writes_nothing,
    CASES,
    (
        1usize..40,
        0usize..40,
        prop_oneof![
            Just(BadItem::QueueName),
            Just(BadItem::UnknownQueue),
            Just(BadItem::NulPayload),
            Just(BadItem::TooDeep),
            Just(BadItem::HugeNumber),
            Just(BadItem::EmptyUniqueKey),
            Just(BadItem::LongUniqueKey),
            Just(BadItem::NulUniqueKey),
            prop_oneof![
                Just(0),
                Just(1001),
                Just(i32::MIN),
                Just(i32::MAX),
                Just(-1)
            ]
            .prop_map(BadItem::MaxAttempts),
            Just(BadItem::RunAt1969),
            Just(BadItem::RunAfterTooLong),
        ]
    ),
    super::one_bad_item
);

// ---------------------------------------------------------------------------------------------
// Batch and claim sizes at their limits

async fn batch_sizes(store: Store) {
    let c = &store.c;
    let queue = store.fresh_queue().await;
    let before = store.counts().await;
    let r = c.enqueue_work(EnqueueWorkParams { items: vec![] }).await;
    refused("an empty batch", r, &["at least one item"]).expect("refused");
    let too_many = vec![NewWork::new(&queue, json!(1)); MAX_ENQUEUE_BATCH + 1];
    let r = c.enqueue_work(EnqueueWorkParams { items: too_many }).await;
    refused("an oversized batch", r, &["exceeds the maximum of 50000"]).expect("refused");
    assert_eq!(store.counts().await, before, "refusals wrote nothing");

    let one = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!(1))],
        })
        .await
        .expect("a batch of one");
    assert_eq!(one.items.len(), 1);
    let full = vec![NewWork::new(&queue, json!(1)); MAX_ENQUEUE_BATCH];
    let out = c
        .enqueue_work(EnqueueWorkParams { items: full })
        .await
        .expect("a batch of the maximum");
    assert_eq!(out.items.len(), MAX_ENQUEUE_BATCH);
    let ids: HashSet<WorkId> = out.items.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), MAX_ENQUEUE_BATCH, "one fresh id per item");
    assert_eq!(
        store.counts().await.work,
        before.work + 1 + MAX_ENQUEUE_BATCH as u64
    );

    let me = store.instance().await;
    let claim = |max_items: u32, queues: Vec<String>| {
        c.claim_work(ClaimWorkParams {
            instance: me,
            queues,
            max_items,
            lease: LEASE,
            async_commit: false,
        })
    };
    for bad in [0, MAX_CLAIM_BATCH + 1, u32::MAX] {
        let r = claim(bad, vec![queue.clone()]).await;
        refused("claim_work", r, &["max_items", &bad.to_string()]).expect("refused");
    }
    let r = claim(1, vec![]).await;
    refused("claim_work of no queue", r, &["at least one queue"]).expect("refused");
    let got = claim(1, vec![queue.clone()]).await.expect("claim one");
    assert_eq!(got.items.len(), 1);
    assert!(got.has_more);
    let got = claim(MAX_CLAIM_BATCH, vec![queue.clone(), queue.clone()])
        .await
        .expect("claim the most");
    assert_eq!(got.items.len(), MAX_CLAIM_BATCH as usize);
    let distinct: HashSet<WorkId> = got.items.iter().map(|i| i.fence.id).collect();
    assert_eq!(
        distinct.len(),
        got.items.len(),
        "a queue named twice yields no item twice"
    );
}

regression!(
    enqueue_and_claim_batch_sizes_are_accepted_up_to_their_limits_and_refused_beyond,
    super::batch_sizes
);

// ---------------------------------------------------------------------------------------------
// Fenced batches: empty, repeated, unknown and negative fences

#[derive(Clone, Copy, Debug)]
enum Pick {
    /// One of the claimed items (index modulo their number).
    Claimed(usize),
    /// A pair that can't exist: an id no sequence reaches, or a negative one.
    Unknown(i64, i64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Renew,
    Complete,
    Fail(u8),
    Release(bool),
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        3 => (0usize..8).prop_map(Pick::Claimed),
        1 => (
            prop_oneof![i64::MIN..0, Just(0i64), (1i64 << 62)..=i64::MAX],
            any::<i64>()
        )
            .prop_map(|(id, token)| Pick::Unknown(id, token)),
        1 => (1i64..1000, prop_oneof![i64::MIN..0, Just(0i64), (1i64 << 62)..=i64::MAX])
            .prop_map(|(id, token)| Pick::Unknown(id, token)),
    ]
}

async fn fenced_batches(store: Store, (n, picks, op): (usize, Vec<Pick>, Op)) -> TestCaseResult {
    let (me, _queue, claimed) = store.claimed(n).await;
    let fences: Vec<Fence> = picks
        .iter()
        .map(|p| match *p {
            Pick::Claimed(i) => claimed[i % n].fence,
            Pick::Unknown(id, token) => Fence { id, token },
        })
        .collect();
    let real: HashSet<Fence> = claimed.iter().map(|c| c.fence).collect();
    let c = &store.c;
    let answered: Vec<(Fence, String)> = match op {
        Op::Renew => {
            let out = accepted(
                "renew_leases",
                c.renew_leases(RenewLeasesParams {
                    instance: me,
                    leases: fences.clone(),
                    lease: LEASE,
                })
                .await,
            )?;
            out.items
                .iter()
                .map(|r| (r.fence, format!("{:?}", r.status)))
                .collect()
        }
        Op::Complete => {
            let out = accepted(
                "complete_work",
                c.complete_work(CompleteWorkParams {
                    instance: me,
                    items: fences.clone(),
                    hand_off: Vec::new(),
                })
                .await,
            )?;
            out.items
                .iter()
                .map(|r| (r.fence, format!("{:?}", r.state)))
                .collect()
        }
        Op::Fail(d) => {
            let disposition = match d % 3 {
                0 => FailDisposition::RetryAfter(Duration::ZERO),
                1 => FailDisposition::DeadLetter,
                _ => FailDisposition::Cancelled,
            };
            let items = fences
                .iter()
                .map(|f| Failure {
                    fence: *f,
                    error: "boom".into(),
                    disposition,
                })
                .collect();
            let out = accepted(
                "fail_work",
                c.fail_work(FailWorkParams {
                    instance: me,
                    items,
                })
                .await,
            )?;
            out.items
                .iter()
                .map(|r| (r.fence, format!("{:?}", r.state)))
                .collect()
        }
        Op::Release(consume_attempt) => {
            let out = accepted(
                "release_work",
                c.release_work(ReleaseWorkParams {
                    instance: me,
                    items: fences.clone(),
                    consume_attempt,
                })
                .await,
            )?;
            out.items
                .iter()
                .map(|r| (r.fence, format!("{:?}", r.state)))
                .collect()
        }
    };
    // One answer per distinct pair, in the order of its first request.
    let mut seen = HashSet::new();
    let distinct: Vec<Fence> = fences.iter().copied().filter(|f| seen.insert(*f)).collect();
    ensure(answered.len() == distinct.len(), || {
        format!(
            "{op:?}: {} distinct pairs, {} answers: {answered:?}",
            distinct.len(),
            answered.len()
        )
    })?;
    let expected_for_real = match op {
        Op::Renew => "Renewed",
        Op::Complete => "Some(Completed)",
        Op::Fail(d) => match d % 3 {
            0 => "Some(Available)",
            1 => "Some(Dead)",
            _ => "Some(Cancelled)",
        },
        Op::Release(_) => "Some(Available)",
    };
    let expected_for_unknown = if matches!(op, Op::Renew) {
        "Lost"
    } else {
        "None"
    };
    for (asked, (fence, answer)) in distinct.iter().zip(&answered) {
        ensure(asked == fence, || {
            format!("{op:?}: asked {asked:?}, answered {fence:?}")
        })?;
        let expected = if real.contains(fence) {
            expected_for_real
        } else {
            expected_for_unknown
        };
        ensure(answer == expected, || {
            format!("{op:?}: {fence:?} answered {answer}, expected {expected}")
        })?;
    }
    // A renewal counts once per call, however often the call names the item.
    if matches!(op, Op::Renew) {
        for f in &real {
            let renewals = store.row(f.id).await.map(|r| r.renewals);
            let expected = i32::from(fences.contains(f));
            ensure(renewals == Some(expected), || {
                format!("item {}: {renewals:?} renewals, expected {expected}", f.id)
            })?;
        }
    }
    Ok(())
}

property!(
    fenced_batches_with_repeated_unknown_or_negative_fences_answer_each_pair_once_in_order,
    CASES,
    (
        1usize..5,
        vec(pick(), 0..12),
        prop_oneof![
            Just(Op::Renew),
            Just(Op::Complete),
            any::<u8>().prop_map(Op::Fail),
            any::<bool>().prop_map(Op::Release)
        ]
    ),
    super::fenced_batches
);

async fn unknown_items(store: Store, id: i64) -> TestCaseResult {
    let me = store.instance().await;
    let c = &store.c;
    let fence = Fence { id, token: id };
    match c
        .checkpoint_work(CheckpointWorkParams {
            instance: me,
            fence,
            checkpoint: json!({}),
        })
        .await
    {
        Err(Error::FencedOut { id: got }) if got == id => {}
        other => {
            return Err(TestCaseError::fail(format!(
                "checkpoint_work of unknown item {id}: {other:?}"
            )))
        }
    }
    let ops = &store.ops;
    let results = [
        ops.cancel_work(CancelWorkParams { id }).await.map(drop),
        ops.retry_dead_work(RetryDeadWorkParams { id })
            .await
            .map(drop),
        ops.discard_work(DiscardWorkParams { id }).await.map(drop),
        ops.get_work(GetWorkParams { id }).await.map(drop),
    ];
    for action in [
        BulkAction::Retry,
        BulkAction::Cancel,
        BulkAction::Discard,
        BulkAction::RunNow,
    ] {
        let out = ops
            .bulk_work(BulkWorkParams {
                action,
                ids: vec![id, id],
            })
            .await;
        match out.as_ref().map(|o| o.items.as_slice()) {
            Ok([item]) if item.id == id && item.result == BulkResult::NotFound => {}
            _ => {
                return Err(TestCaseError::fail(format!(
                    "bulk {action:?} of unknown item {id}: {out:?}"
                )))
            }
        }
    }
    for r in results {
        match r {
            Err(Error::NotFound { id: got }) if got == id => {}
            other => {
                return Err(TestCaseError::fail(format!(
                    "operator call on unknown item {id}: {other:?}"
                )))
            }
        }
    }
    Ok(())
}

property!(
    operator_calls_and_checkpoints_on_unknown_or_negative_ids_say_so,
    Cases { pg: 24, fake: 128 },
    prop_oneof![i64::MIN..=0, (1i64 << 62)..=i64::MAX],
    super::unknown_items
);

// ---------------------------------------------------------------------------------------------
// Page cursors and filter texts

/// The documented cursor: `v1.` then a positive id without leading zeros that fits an i64.
fn cursor_ok(cursor: &str) -> bool {
    cursor.strip_prefix("v1.").is_some_and(|d| {
        !d.is_empty()
            && !d.starts_with('0')
            && d.bytes().all(|b| b.is_ascii_digit())
            && d.parse::<i64>().is_ok()
    })
}

async fn cursors(store: Store, cursor: String) -> TestCaseResult {
    let r = store
        .ops
        .list_work(ListWorkParams {
            cursor: Some(cursor.clone()),
            ..Default::default()
        })
        .await;
    if cursor_ok(&cursor) {
        accepted(&format!("cursor {cursor:?}"), r).map(drop)
    } else {
        refused(&format!("cursor {cursor:?}"), r, &["malformed cursor"])
    }
}

property!(
    a_page_cursor_is_read_or_refused_as_malformed,
    CASES,
    prop_oneof![
        any_text(40),
        "v1\\.[0-9]{0,21}",
        "v1\\.-?[1-9][0-9]{0,3}[a-z ]?",
        (1i64..=i64::MAX).prop_map(|id| format!("v1.{id}")),
    ],
    super::cursors
);

async fn filter_texts(store: Store, text: String) -> TestCaseResult {
    let r = store
        .ops
        .list_work(ListWorkParams {
            filter: WorkFilter::new().error_contains(text.clone()),
            ..Default::default()
        })
        .await;
    if !text.is_empty() && text.len() <= 1024 && !text.contains('\0') {
        accepted(&format!("error_contains {text:?}"), r).map(drop)
    } else {
        refused(&format!("error_contains {text:?}"), r, &["error_contains"])
    }
}

property!(
    an_error_text_filter_is_applied_or_refused_naming_it,
    CASES,
    prop_oneof![any_text(40), "[a-z%_\\\\]{0,8}", "x{1020,1030}"],
    super::filter_texts
);

// ---------------------------------------------------------------------------------------------
// Priorities

async fn priorities(store: Store, (prios, round): (Vec<i16>, u32)) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let items = prios
        .iter()
        .map(|p| NewWork::new(&queue, json!(p)).priority(*p))
        .collect();
    let ids = accepted(
        "enqueue_work",
        store.c.enqueue_work(EnqueueWorkParams { items }).await,
    )?;
    // Lower first; equal priorities in enqueue order (same run_at, ascending ids).
    let mut expected: Vec<(i16, WorkId)> = prios
        .iter()
        .zip(&ids.items)
        .map(|(p, e)| (*p, e.id))
        .collect();
    expected.sort();
    let me = store.instance().await;
    // Each claim of `round` items takes the lowest that are left (a claim returns its
    // items in no particular order).
    for want in expected.chunks(round as usize) {
        let out = accepted(
            "claim_work",
            store
                .c
                .claim_work(ClaimWorkParams {
                    instance: me,
                    queues: vec![queue.clone()],
                    max_items: round,
                    lease: LEASE,
                    async_commit: false,
                })
                .await,
        )?;
        let mut got: Vec<(i16, WorkId)> =
            out.items.iter().map(|c| (c.priority, c.fence.id)).collect();
        got.sort();
        ensure(got == want, || {
            format!("claimed {got:?}, expected {want:?}")
        })?;
    }
    Ok(())
}

property!(
    priorities_across_the_whole_i16_range_are_accepted_and_claimed_lowest_first,
    CASES,
    vec(
        prop_oneof![
            3 => any::<i16>(),
            1 => prop::sample::select(vec![i16::MIN, i16::MIN + 1, -1, 0, 1, i16::MAX - 1, i16::MAX]),
        ],
        1..40
    )
    .prop_flat_map(|prios| {
        let n = prios.len() as u32;
        (Just(prios), 1..=n)
    }),
    super::priorities
);

// ---------------------------------------------------------------------------------------------
// Times and durations

async fn business_times(store: Store, at: DateTime<Utc>) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let before = store.counts().await;
    let r = store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!(1)).run_at(at)],
        })
        .await;
    if !(1970..=9999).contains(&at.year()) {
        refused("enqueue_work", r, &["item 0", "run_at", "1970 to 9999"])?;
        return unchanged(&store, &before, "enqueue_work").await;
    }
    let id = accepted("enqueue_work", r)?.items[0].id;
    let state = store.row(id).await.map(|r| r.state);
    let now = Utc::now();
    // Times far from now only: the store's clock and this one may differ a little.
    if at < now - chrono::Duration::hours(1) {
        ensure(state == Some(WorkState::Available), || {
            format!("{at} is past, but the item is {state:?}")
        })?;
        let me = store.instance().await;
        let claimed = store.claim(me, &queue).await;
        ensure(claimed.len() == 1, || format!("{at}: claimed {claimed:?}"))?;
    } else if at > now + chrono::Duration::hours(1) {
        ensure(state == Some(WorkState::Scheduled), || {
            format!("{at} is ahead, but the item is {state:?}")
        })?;
        let me = store.instance().await;
        let claimed = store.claim(me, &queue).await;
        ensure(claimed.is_empty(), || format!("{at}: claimed {claimed:?}"))?;
    }
    Ok(())
}

property!(
    business_times_are_accepted_from_1970_to_9999_and_refused_outside,
    CASES,
    business_time(),
    super::business_times
);

async fn delays(store: Store, delay: Duration) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let before = store.counts().await;
    let r = store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!(1)).run_after(delay)],
        })
        .await;
    if delay > MAX_SCHEDULE_AHEAD {
        refused("enqueue_work", r, &["item 0", "run_after", "100 years"])?;
        return unchanged(&store, &before, "enqueue_work").await;
    }
    let id = accepted("enqueue_work", r)?.items[0].id;
    let state = store.row(id).await.map(|r| r.state);
    if delay.as_micros() == 0 {
        ensure(state == Some(WorkState::Available), || {
            format!("a delay of {delay:?} is none, but the item is {state:?}")
        })?;
    } else if delay >= Duration::from_secs(1) {
        ensure(state == Some(WorkState::Scheduled), || {
            format!("a delay of {delay:?}, but the item is {state:?}")
        })?;
    }
    Ok(())
}

property!(
    delays_are_accepted_up_to_100_years_and_refused_beyond,
    CASES,
    duration(),
    super::delays
);

async fn leases(store: Store, lease: Duration) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![
                NewWork::new(&queue, json!(1)),
                NewWork::new(&queue, json!(2)),
            ],
        })
        .await
        .expect("enqueue");
    let me = store.instance().await;
    let r = store
        .c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec![queue.clone()],
            max_items: 1,
            lease,
            async_commit: false,
        })
        .await;
    if lease_ok(lease) {
        let items = accepted("claim_work", r)?.items;
        ensure(items.len() == 1, || format!("claimed {items:?}"))?;
    } else {
        refused("claim_work", r, &["lease", "between 1 µs and 24 h"])?;
    }
    // Renew a lease that a valid claim took.
    let fence = store
        .c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec![queue.clone()],
            max_items: 1,
            lease: LEASE,
            async_commit: false,
        })
        .await
        .expect("claim")
        .items[0]
        .fence;
    let r = store
        .c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![fence],
            lease,
        })
        .await;
    if lease_ok(lease) {
        let items = accepted("renew_leases", r)?.items;
        ensure(
            items.len() == 1 && items[0].status == RenewalStatus::Renewed,
            || format!("renewed {items:?}"),
        )?;
    } else {
        refused("renew_leases", r, &["lease", "between 1 µs and 24 h"])?;
        let renewals = store.row(fence.id).await.map(|r| r.renewals);
        ensure(renewals == Some(0), || {
            format!("a refused renewal counted: {renewals:?}")
        })?;
    }
    Ok(())
}

property!(
    leases_are_accepted_from_1_microsecond_to_24_hours_and_refused_outside,
    CASES,
    duration(),
    super::leases
);

async fn retry_delays(store: Store, delay: Duration) -> TestCaseResult {
    let (me, _queue, claimed) = store.claimed(1).await;
    let fence = claimed[0].fence;
    let r = store
        .c
        .fail_work(FailWorkParams {
            instance: me,
            items: vec![Failure {
                fence,
                error: "boom".into(),
                disposition: FailDisposition::RetryAfter(delay),
            }],
        })
        .await;
    let state = |r: Option<RowView>| r.map(|r| r.state);
    if delay > MAX_SCHEDULE_AHEAD {
        refused(
            "fail_work",
            r,
            &[&format!("item {}", fence.id), "retry delay", "100 years"],
        )?;
        let now = state(store.row(fence.id).await);
        return ensure(now == Some(WorkState::Running), || {
            format!("a refused failure changed the item: {now:?}")
        });
    }
    let items = accepted("fail_work", r)?.items;
    let expected = if delay.as_micros() == 0 {
        WorkState::Available
    } else {
        WorkState::Scheduled
    };
    ensure(items.len() == 1 && items[0].state == Some(expected), || {
        format!("a retry after {delay:?}: {items:?}, expected {expected:?}")
    })
}

property!(
    retry_delays_are_accepted_up_to_100_years_and_refused_beyond,
    CASES,
    duration(),
    super::retry_delays
);

fn cutoff_ok(d: Duration) -> bool {
    d.as_micros() >= 1 && d <= MAX_SCHEDULE_AHEAD
}

/// The store's floor of each cutoff (`liveness_floor`, as migrated).
const FLOOR: [(&str, Duration); 3] = [
    ("stale_after", Duration::from_secs(1)),
    ("dead_after", Duration::from_secs(2)),
    ("lock_grace", Duration::from_millis(500)),
];

async fn cutoffs(
    store: Store,
    (stale_after, dead_after, lock_grace): (Duration, Option<Duration>, Option<Duration>),
) -> TestCaseResult {
    let given = [Some(stale_after), dead_after, lock_grace];
    // The range is checked first (by the coordinator), then the store's floor; name the
    // first bad one, in the order the parameters are checked.
    let out_of_range = FLOOR
        .iter()
        .zip(given)
        .find(|(_, d)| !d.is_none_or(cutoff_ok))
        .map(|((name, _), _)| (*name, "between 1 µs and 100 years"));
    let below_floor = FLOOR
        .iter()
        .zip(given)
        .find(|((_, floor), d)| d.is_some_and(|d| d < *floor))
        .map(|((name, _), _)| (*name, "the store's floor"));
    let problem = out_of_range.or(below_floor);
    let valid = problem.is_none();
    let (named, reason) = problem.unwrap_or(("", ""));
    let me = InstanceId::new();
    let r = store
        .c
        .record_heartbeat(RecordHeartbeatParams {
            stale_after,
            dead_after,
            lock_grace,
            ..heartbeat(me, json!({}))
        })
        .await;
    if valid {
        accepted("record_heartbeat", r)?;
    } else {
        refused("record_heartbeat", r, &[named, reason])?;
        let registered = store.instance_registered(me).await;
        ensure(!registered, || {
            "a refused heartbeat registered the instance".into()
        })?;
    }
    let r = store
        .c
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: Some(me),
            stale_after,
            dead_after,
            lock_grace,
        })
        .await;
    if valid {
        accepted("cleanup_stale_instances", r)?;
    } else {
        refused("cleanup_stale_instances", r, &[named, reason])?;
    }
    let day = Duration::from_secs(86_400);
    let r = store
        .c
        .maintenance_due(MaintenanceDueParams {
            judge: Some(me),
            stale_after,
            dead_after,
            lock_grace,
            completed_retention: day,
            dead_retention: day,
            evicted_retention: day,
            lapsed_look_every: Duration::ZERO,
        })
        .await;
    if valid {
        accepted("maintenance_due", r)?;
    } else {
        refused("maintenance_due", r, &[named, reason])?;
    }
    Ok(())
}

property!(
    liveness_cutoffs_are_accepted_from_1_microsecond_to_100_years_and_refused_outside,
    CASES,
    (
        duration(),
        prop::option::of(duration()),
        prop::option::of(duration())
    ),
    super::cutoffs
);

// ---------------------------------------------------------------------------------------------
// Unique keys

async fn unique_keys(store: Store, key: String) -> TestCaseResult {
    let queue = store.fresh_queue().await;
    let valid = !key.is_empty() && key.len() <= MAX_UNIQUE_KEY_BYTES && !key.contains('\0');
    let before = store.counts().await;
    let enqueue = || {
        store.c.enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!(1)).unique_key(&key)],
        })
    };
    let r = enqueue().await;
    if !valid {
        refused("enqueue_work", r, &["item 0", "unique_key"])?;
        return unchanged(&store, &before, "enqueue_work").await;
    }
    let first = accepted("enqueue_work", r)?.items[0];
    let second = accepted("enqueue_work again", enqueue().await)?.items[0];
    ensure(
        first.inserted && !second.inserted && first.id == second.id,
        || format!("the same key {key:?} twice: {first:?} then {second:?}"),
    )
}

property!(
    unique_keys_of_1_to_512_bytes_without_nul_deduplicate_and_others_are_refused,
    CASES,
    prop_oneof![
        3 => any_text(40),
        1 => vec(any::<char>(), 100..300).prop_map(String::from_iter),
        1 => (505usize..520).prop_map(|n| "k".repeat(n)),
        1 => (250usize..260).prop_map(|n| "é".repeat(n)),
        1 => Just(String::new()),
        1 => Just("\0".to_owned()),
    ],
    super::unique_keys
);

// ---------------------------------------------------------------------------------------------
// Failure messages

async fn failure_messages(store: Store, (error, dead): (String, bool)) -> TestCaseResult {
    let (me, _queue, claimed) = store.claimed(1).await;
    let fence = claimed[0].fence;
    let disposition = if dead {
        FailDisposition::DeadLetter
    } else {
        FailDisposition::RetryAfter(Duration::from_secs(60))
    };
    let out = accepted(
        "fail_work",
        store
            .c
            .fail_work(FailWorkParams {
                instance: me,
                items: vec![Failure {
                    fence,
                    error: error.clone(),
                    disposition,
                }],
            })
            .await,
    )?;
    ensure(out.items[0].state.is_some(), || {
        format!("fenced out: {out:?}")
    })?;
    let recorded = store
        .row(fence.id)
        .await
        .and_then(|r| r.errors.last().map(|e| e.error.clone()));
    let expected: String = error.replace('\0', "\u{FFFD}").chars().take(8192).collect();
    ensure(recorded.as_deref() == Some(expected.as_str()), || {
        format!(
            "a failure of {} characters was recorded as {:?} characters",
            error.chars().count(),
            recorded.map(|r| r.chars().count())
        )
    })
}

property!(
    failure_messages_of_any_text_are_recorded_sanitised_and_truncated,
    Cases { pg: 24, fake: 48 },
    (
        prop_oneof![
            4 => any_text(64),
            1 => (8180usize..8200).prop_map(|n| "é".repeat(n)),
            1 => Just("\0".repeat(9000)),
            1 => Just("x".repeat(1 << 20)),
            1 => Just("💥\0".repeat(300_000)),
        ],
        any::<bool>()
    ),
    super::failure_messages
);

// ---------------------------------------------------------------------------------------------
// Heartbeat metadata and host names

async fn metadata(store: Store, (metadata, host): (Value, String)) -> TestCaseResult {
    let me = InstanceId::new();
    let valid = payload_ok(&metadata);
    let r = store
        .c
        .record_heartbeat(RecordHeartbeatParams {
            host,
            ..heartbeat(me, metadata.clone())
        })
        .await;
    let registered = store.instance_registered(me).await;
    flatten_drop(metadata);
    if valid {
        accepted("record_heartbeat", r)?;
        ensure(registered, || {
            "a heartbeat did not register the instance".into()
        })
    } else {
        refused("record_heartbeat", r, &["metadata"])?;
        ensure(!registered, || {
            "a refused heartbeat registered the instance".into()
        })
    }
}

property!(
    heartbeat_metadata_follows_the_payload_rules_and_any_host_name_is_recorded,
    CASES,
    (json_value(), any_text(64)),
    super::metadata
);

// ---------------------------------------------------------------------------------------------
// Schema names (PostgreSQL only)

async fn schemas(pool: &PgPool) -> HashSet<String> {
    sqlx::query_scalar("SELECT nspname::text FROM pg_namespace")
        .fetch_all(pool)
        .await
        .expect("list schemas")
        .into_iter()
        .collect()
}

#[test]
fn schema_names_are_accepted_only_when_plain_lowercase_identifiers() {
    let rt = runtime();
    let store = rt.block_on(Store::open(Kind::Postgres));
    let pg = store.pg.clone().expect("PostgreSQL");
    let mut expected = rt.block_on(schemas(&pg.pool));
    let strategy = prop_oneof![
        1 => "[a-z_][a-z0-9_]{0,41}",
        1 => prop::sample::select(vec![
            "public", "information_schema", "pg_catalog", "pg_temp", "pg_toast", "user",
            "select", "_", "workpump",
        ])
        .prop_map(str::to_owned),
        4 => any_text(60),
        1 => "[A-Za-z0-9_\"$-]{0,45}",
    ];
    let accepted_names = std::sync::Mutex::new(Vec::new());
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |name| {
        rt.block_on(async {
            let valid = schema_name_ok(&name);
            let r = PgCoordinator::with_schema(pg.pool.clone(), &name);
            if valid {
                let c = accepted("with_schema", r)?;
                ensure(c.schema() == name, || format!("schema {:?}", c.schema()))?;
            } else {
                refused("with_schema", r.map(drop), &["schema name"])?;
            }
            let r = migrate(&pg.pool, &name).await;
            if valid {
                accepted("migrate", r)?;
                accepted_names.lock().expect("names").push(name.clone());
                // The schema works: a queue registers in it.
                let c = PgCoordinator::with_schema(pg.pool.clone(), &name).expect("valid");
                accepted(
                    "register_queue",
                    c.register_queue(RegisterQueueParams::new("q")).await,
                )?;
            } else {
                refused("migrate", r, &["schema name"])?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    expected.extend(accepted_names.into_inner().expect("names"));
    let now = rt.block_on(schemas(&pg.pool));
    assert_eq!(now, expected, "only the accepted schemas were created");
    rt.block_on(store.close());
}

// ---------------------------------------------------------------------------------------------
// Regressions: one deterministic test per bug the properties found

/// Was: a database error (timestamp out of range) on PostgreSQL, a panic in the fake's clock
/// arithmetic.
async fn huge_cutoffs(store: Store) {
    let me = InstanceId::new();
    for (stale_after, dead_after, lock_grace, named) in [
        (Duration::MAX, None, None, "stale_after"),
        (STALE, Some(Duration::MAX), None, "dead_after"),
        (STALE, None, Some(Duration::MAX), "lock_grace"),
        (
            Duration::from_secs(300_000 * 366 * 86_400),
            None,
            None,
            "stale_after",
        ),
    ] {
        let r = store
            .c
            .record_heartbeat(RecordHeartbeatParams {
                stale_after,
                dead_after,
                lock_grace,
                ..heartbeat(me, json!({}))
            })
            .await;
        refused("record_heartbeat", r, &[named, "100 years"]).expect("refused");
        let r = store
            .c
            .cleanup_stale_instances(CleanupStaleInstancesParams {
                judge: None,
                stale_after,
                dead_after,
                lock_grace,
            })
            .await;
        refused("cleanup_stale_instances", r, &[named, "100 years"]).expect("refused");
    }
    assert!(!store.instance_registered(me).await);
    let hundred_years = MAX_SCHEDULE_AHEAD;
    store
        .c
        .record_heartbeat(RecordHeartbeatParams {
            stale_after: hundred_years,
            dead_after: Some(hundred_years),
            lock_grace: Some(hundred_years),
            ..heartbeat(me, json!({}))
        })
        .await
        .expect("100 years is accepted");
}

regression!(
    a_liveness_cutoff_beyond_100_years_is_refused_instead_of_failing_in_the_store,
    super::huge_cutoffs
);

/// Was: a database error on PostgreSQL (jsonb refuses \u0000), accepted by the fake.
async fn nul_metadata(store: Store) {
    let me = InstanceId::new();
    for metadata in [json!({"a": "x\0y"}), json!({"k\0": 1})] {
        let r = store.c.record_heartbeat(heartbeat(me, metadata)).await;
        refused("record_heartbeat", r, &["metadata", "NUL"]).expect("refused");
    }
    assert!(!store.instance_registered(me).await);
    store
        .c
        .record_heartbeat(RecordHeartbeatParams {
            host: "host\0name".into(),
            ..heartbeat(me, json!({"a": "\\u0000"}))
        })
        .await
        .expect("a NUL in the host name is replaced, and the escape text is not a NUL");
}

regression!(
    heartbeat_metadata_with_a_nul_character_is_refused_instead_of_a_database_error,
    super::nul_metadata
);

/// Was: accepted, then every claim of the item failed to decode it on PostgreSQL (jsonb
/// prints it as 309 digits, which serde_json reads back as infinity), and took the other
/// items of its claim batch down with it.
async fn huge_numbers(store: Store) {
    let queue = store.fresh_queue().await;
    for n in [f64::MAX, -f64::MAX, 1.0000000000000002e308] {
        let r = store
            .c
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new(&queue, json!({ "n": n }))],
            })
            .await;
        refused("enqueue_work", r, &["item 0", "1e308"]).expect("refused");
    }
    let (me, _, claimed) = store.claimed(1).await;
    let r = store
        .c
        .checkpoint_work(CheckpointWorkParams {
            instance: me,
            fence: claimed[0].fence,
            checkpoint: json!([f64::MAX]),
        })
        .await;
    refused("checkpoint_work", r, &["checkpoint", "1e308"]).expect("refused");
    store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!([1e308, -1e308]))],
        })
        .await
        .expect("1e308 is accepted");
    let me = store.instance().await;
    let got = store.claim(me, &queue).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, json!([1e308, -1e308]));
}

regression!(
    a_payload_number_beyond_1e308_is_refused_instead_of_poisoning_every_claim,
    super::huge_numbers
);

/// Was: accepted at 128 levels, then every claim failed to decode it on PostgreSQL
/// (serde_json's recursion limit refuses a 128th level).
async fn depth_limit(store: Store) {
    let queue = store.fresh_queue().await;
    let r = store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, nested(128, json!(1), false))],
        })
        .await;
    refused("enqueue_work", r, &["item 0", "nested more than 127"]).expect("refused");
    let deepest = nested(MAX_PAYLOAD_DEPTH, json!("leaf"), true);
    store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, deepest.clone())],
        })
        .await
        .expect("the depth limit is accepted");
    let me = store.instance().await;
    let got = store.claim(me, &queue).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, deepest);
}

regression!(
    a_payload_at_the_depth_limit_reads_back_and_one_level_more_is_refused,
    super::depth_limit
);

/// Was: PostgreSQL answered a repeated lease once per repeat squared (five answers for three
/// requests), the fake renewed it twice; then each request got an answer. Now: one answer per
/// distinct lease, in the order of its first request, and one renewal.
async fn repeated_renewal(store: Store) {
    let (me, _, claimed) = store.claimed(2).await;
    let (a, b) = (claimed[0].fence, claimed[1].fence);
    let out = store
        .c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![a, a, b, a],
            lease: LEASE,
        })
        .await
        .expect("renew");
    let answers: Vec<(Fence, RenewalStatus)> =
        out.items.iter().map(|r| (r.fence, r.status)).collect();
    use RenewalStatus::Renewed;
    assert_eq!(answers, vec![(a, Renewed), (b, Renewed)]);
    assert_eq!(store.row(a.id).await.map(|r| r.renewals), Some(1));
    assert_eq!(store.row(b.id).await.map(|r| r.renewals), Some(1));
}

regression!(
    renewing_the_same_lease_twice_in_one_call_answers_and_renews_it_once,
    super::repeated_renewal
);

/// Was: the fake answered the repeat as fenced out, PostgreSQL with the item's new state (a
/// second disposition reported as applied). Now: one answer per distinct claim, the first
/// disposition's.
async fn repeated_outcomes(store: Store) {
    let (me, _, claimed) = store.claimed(2).await;
    let (a, b) = (claimed[0].fence, claimed[1].fence);
    let failure = |fence| Failure {
        fence,
        error: "boom".into(),
        disposition: FailDisposition::DeadLetter,
    };
    let out = store
        .c
        .fail_work(FailWorkParams {
            instance: me,
            items: vec![failure(a), failure(a)],
        })
        .await
        .expect("fail");
    let states: Vec<_> = out.items.iter().map(|r| (r.fence, r.state)).collect();
    assert_eq!(states, vec![(a, Some(WorkState::Dead))]);
    assert_eq!(store.row(a.id).await.map(|r| r.errors.len()), Some(1));
    let out = store
        .c
        .release_work(ReleaseWorkParams {
            instance: me,
            items: vec![b, b],
            consume_attempt: false,
        })
        .await
        .expect("release");
    let states: Vec<_> = out.items.iter().map(|r| (r.fence, r.state)).collect();
    assert_eq!(states, vec![(b, Some(WorkState::Available))]);
}

regression!(
    failing_or_releasing_the_same_claim_twice_in_one_call_answers_it_once,
    super::repeated_outcomes
);

/// Was: the fake scheduled the item 1 ns ahead; PostgreSQL (microsecond intervals) made it
/// due at once.
async fn sub_microsecond_delays(store: Store) {
    let queue = store.fresh_queue().await;
    let out = store
        .c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new(&queue, json!(1)).run_after(Duration::from_nanos(999))],
        })
        .await
        .expect("enqueue");
    let state = store.row(out.items[0].id).await.map(|r| r.state);
    assert_eq!(state, Some(WorkState::Available));
    let (me, _, claimed) = store.claimed(1).await;
    let out = store
        .c
        .fail_work(FailWorkParams {
            instance: me,
            items: vec![Failure {
                fence: claimed[0].fence,
                error: "boom".into(),
                disposition: FailDisposition::RetryAfter(Duration::from_nanos(1)),
            }],
        })
        .await
        .expect("fail");
    assert_eq!(out.items[0].state, Some(WorkState::Available));
}

regression!(
    a_delay_under_a_microsecond_is_no_delay_in_either_store,
    super::sub_microsecond_delays
);

/// Was: accepted, and migrate created workpump's tables in the SQL standard's system schema.
#[test]
fn information_schema_is_refused_as_a_schema_name() {
    let rt = runtime();
    let store = rt.block_on(Store::open(Kind::Postgres));
    let pg = store.pg.clone().expect("PostgreSQL");
    let r = rt.block_on(migrate(&pg.pool, "information_schema"));
    refused("migrate", r, &["information_schema"]).expect("refused");
    let tables: i64 = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'information_schema' AND tablename = 'work'",
            )
            .fetch_one(&pg.pool),
        )
        .expect("count");
    assert_eq!(tables, 0);
    let r = PgCoordinator::with_schema(pg.pool.clone(), "information_schema");
    refused("with_schema", r.map(drop), &["schema name"]).expect("refused");
    rt.block_on(store.close());
}
