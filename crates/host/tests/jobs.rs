//! Typed jobs end to end on PostgreSQL: kinds sharing a queue and its concurrency, a kind
//! nobody handles, enqueue alone, in bulk and in the caller's transaction, a producer-only
//! client, the logs of failed attempts and dead letters, and the host's hooks and layers.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use workpump_coordinator::testing::Logs;
use workpump_coordinator::{Error, GetWorkParams, Operations, WorkCoordinator, WorkState};
use workpump_host::{
    handler_fn, Client, Host, HostError, HostHandle, Job, JobArgs, JobError, NewWork, QueueConfig,
};

use support::{count_state, database, fast_config, holds_for, wait_until};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
    const QUEUE: &'static str = "mixed";
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Resize {
    image: String,
    width: u32,
}

impl JobArgs for Resize {
    const KIND: &'static str = "resize";
    const QUEUE: &'static str = "mixed";
    const PRIORITY: i16 = -5;
    const MAX_ATTEMPTS: Option<i32> = Some(2);
}

/// A kind whose every attempt fails, in a queue of its own.
#[derive(Serialize, Deserialize)]
struct Flaky {
    n: u32,
}

impl JobArgs for Flaky {
    const KIND: &'static str = "flaky";
    const QUEUE: &'static str = "flaky";
    const MAX_ATTEMPTS: Option<i32> = Some(2);
}

/// Handlers running now, and the most that ever ran at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    async fn hold(&self, d: Duration) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(d).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

type Ran = Arc<Mutex<Vec<String>>>;

async fn start(url: &str, ran: &Ran, gauge: &Arc<Gauge>) -> HostHandle {
    let mut config = fast_config();
    config.queues.insert(
        "mixed".into(),
        QueueConfig {
            concurrency: Some(2),
            ..QueueConfig::default()
        },
    );
    config.queues.insert(
        "flaky".into(),
        QueueConfig {
            backoff_base_ms: Some(10),
            backoff_cap_ms: Some(20),
            ..QueueConfig::default()
        },
    );
    let (r1, g1) = (ran.clone(), gauge.clone());
    let (r2, g2) = (ran.clone(), gauge.clone());
    Host::builder()
        .config(config)
        .database_url(url)
        .job(handler_fn(move |job: Job<SendEmail>| {
            let (ran, gauge) = (r1.clone(), g1.clone());
            async move {
                assert_eq!(job.kind(), Some("send_email"));
                gauge.hold(Duration::from_millis(20)).await;
                ran.lock()
                    .expect("ran")
                    .push(format!("email {}", job.payload().to));
                Ok(())
            }
        }))
        .job(handler_fn(move |job: Job<Resize>| {
            let (ran, gauge) = (r2.clone(), g2.clone());
            async move {
                gauge.hold(Duration::from_millis(20)).await;
                ran.lock()
                    .expect("ran")
                    .push(format!("resize {}", job.payload().image));
                Ok(())
            }
        }))
        .job(handler_fn(|job: Job<Flaky>| async move {
            Err(JobError::retry(format!("flaky {} broke", job.payload().n)))
        }))
        .start()
        .await
        .expect("the host starts")
}

#[tokio::test]
async fn kinds_share_their_queue_and_its_concurrency_and_each_runs_its_own_handler() {
    let (db, pool) = database().await;
    let (ran, gauge): (Ran, Arc<Gauge>) = Default::default();
    let host = start(db.url(), &ran, &gauge).await;

    let emails = (0..12).map(|i| {
        SendEmail {
            to: format!("{i}@b.c"),
        }
        .to_work()
    });
    let resizes = (0..12).map(|i| {
        Resize {
            image: format!("{i}.png"),
            width: 100,
        }
        .to_work()
    });
    let batch: Vec<NewWork> = emails
        .chain(resizes)
        .collect::<Result<_, _>>()
        .expect("the arguments serialise");
    let out = host.enqueue_many(batch).await.expect("one mixed batch");
    assert_eq!(out.items.len(), 24);
    let single = host
        .enqueue(SendEmail {
            to: "alone@b.c".into(),
        })
        .await
        .expect("one typed item");
    assert!(single.inserted);

    wait_until(Duration::from_secs(20), "all 25 items complete", || async {
        count_state(&pool, "completed").await == 25
    })
    .await;
    let ran = ran.lock().expect("ran").clone();
    assert_eq!(ran.iter().filter(|r| r.starts_with("email ")).count(), 13);
    assert_eq!(ran.iter().filter(|r| r.starts_with("resize ")).count(), 12);
    assert!(ran.contains(&"email alone@b.c".to_owned()));
    // One queue, one limit of 2 for both kinds; reached, never passed.
    assert_eq!(gauge.max.load(Ordering::SeqCst), 2);

    // The kind's defaults went into the store with the item.
    let resize = host
        .pg()
        .expect("pg")
        .get_work(GetWorkParams {
            id: out.items[12].id,
        })
        .await
        .expect("get_work")
        .item;
    assert_eq!(resize.kind.as_deref(), Some("resize"));
    assert_eq!((resize.priority, resize.max_attempts), (-5, 2));
    assert_eq!(resize.payload, json!({ "image": "0.png", "width": 100 }));

    stop(host, pool, db).await;
}

#[tokio::test]
async fn an_item_of_a_kind_nobody_handles_fails_naming_the_kind_and_dead_letters_at_its_limit() {
    let (db, pool) = database().await;
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (ran, gauge): (Ran, Arc<Gauge>) = Default::default();
    let host = start(db.url(), &ran, &gauge).await;
    let unknown = host
        .enqueue(NewWork::new("mixed", json!({})).kind("fax").max_attempts(2))
        .await
        .expect("an item of an unknown kind is accepted (another release may handle it)");
    let untyped = host
        .enqueue(NewWork::new("mixed", json!({})).max_attempts(1))
        .await
        .expect("an untyped item");
    // A trace context in the metadata is a field of the attempt's span.
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let flaky = host
        .enqueue(
            Flaky { n: 7 }
                .to_work()
                .expect("serialises")
                .metadata(json!({ "traceparent": traceparent })),
        )
        .await
        .expect("flaky");

    wait_until(
        Duration::from_secs(20),
        "all three are dead letters",
        || async { count_state(&pool, "dead").await == 3 },
    )
    .await;
    let pg = host.pg().expect("pg").clone();
    let history = |id| {
        let pg = pg.clone();
        async move {
            let item = pg
                .get_work(GetWorkParams { id })
                .await
                .expect("get_work")
                .item;
            assert_eq!(item.state, WorkState::Dead);
            item.history
                .iter()
                .map(|h| h.error.clone())
                .collect::<Vec<_>>()
        }
    };
    let errors = history(unknown.id).await;
    assert_eq!(errors.len(), 2, "both attempts failed: {errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| e.contains("no handler for job kind \"fax\"")
                && e.contains("resize, send_email")),
        "{errors:?}"
    );
    let errors = history(untyped.id).await;
    assert!(
        errors[0].contains("an item without a job kind in queue \"mixed\""),
        "{errors:?}"
    );
    assert_eq!(history(flaky.id).await.len(), 2);

    // Every failed attempt is a warning and every dead letter an error, with the error and
    // inside the attempt's span. The worker logs an outcome once the store took it: moments
    // after the row says so.
    wait_until(
        Duration::from_secs(10),
        "the dead letters are logged",
        || async { logs.text().matches("is a dead letter").count() >= 3 },
    )
    .await;
    let text = logs.text();
    let lines = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        lines(&format!(
            "item {} of queue \"flaky\" failed attempt 1 of 2; it will be retried: flaky 7 broke",
            flaky.id
        )),
        1,
        "{text}"
    );
    let dead = text
        .lines()
        .find(|l| {
            l.contains(&format!(
                "item {} of queue \"flaky\" is a dead letter after attempt 2 of 2: flaky 7 broke",
                flaky.id
            ))
        })
        .unwrap_or_else(|| panic!("no dead-letter line: {text}"));
    assert!(dead.contains("ERROR"), "{dead}");
    assert!(
        dead.contains("workpump.job") && dead.contains("kind=\"flaky\""),
        "{dead}"
    );
    assert!(
        dead.contains(&format!("traceparent=\"{traceparent}\"")),
        "{dead}"
    );
    assert_eq!(
        lines(&format!(
            "item {} of queue \"mixed\" is a dead letter",
            unknown.id
        )),
        1
    );

    stop(host, pool, db).await;
}

#[tokio::test]
async fn enqueue_in_the_callers_transaction_commits_or_rolls_back_with_it_and_a_client_only_produces(
) {
    let (db, pool) = database().await;
    let (ran, gauge): (Ran, Arc<Gauge>) = Default::default();
    let host = start(db.url(), &ran, &gauge).await;
    host.ready().await.expect("ready");

    let mut tx = pool.begin().await.expect("begin");
    host.enqueue_in(
        &mut tx,
        SendEmail {
            to: "rolled@b.c".into(),
        },
    )
    .await
    .expect("enqueue in the transaction");
    tx.rollback().await.expect("rollback");

    // A producer with no handler and no worker: a client on its own pool.
    let client = Client::connect(db.url()).expect("a client");
    let mut tx = pool.begin().await.expect("begin");
    let out = client
        .enqueue_many_in(
            &mut tx,
            [
                SendEmail {
                    to: "kept@b.c".into(),
                },
                SendEmail {
                    to: "also@b.c".into(),
                },
            ],
        )
        .await
        .expect("a batch in the transaction");
    assert_eq!(out.items.len(), 2);
    tx.commit().await.expect("commit");
    client
        .enqueue(Resize {
            image: "c.png".into(),
            width: 1,
        })
        .await
        .expect("a client enqueues alone");

    wait_until(
        Duration::from_secs(20),
        "the committed items run",
        || async { count_state(&pool, "completed").await == 3 },
    )
    .await;
    let ran = ran.lock().expect("ran").clone();
    assert!(!ran.contains(&"email rolled@b.c".to_owned()), "{ran:?}");
    assert!(ran.contains(&"email kept@b.c".to_owned()) && ran.contains(&"resize c.png".to_owned()));

    // A client registers nothing: an unknown queue is refused, naming it, and nothing is
    // written; so is a kind out of range.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("count");
    let err = client
        .enqueue(NewWork::new("nobody-declared-this", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "nobody-declared-this"),
        "{err}"
    );
    let err = client
        .enqueue(NewWork::new("mixed", json!({})).kind(""))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("job kind"), "{err}");
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(before, after);
    let queues: Vec<String> = sqlx::query_scalar("SELECT name FROM workpump.queues ORDER BY name")
        .fetch_all(&pool)
        .await
        .expect("queues");
    assert_eq!(queues, ["flaky", "mixed"], "the client declared no queue");

    stop(host, pool, db).await;
}

#[tokio::test]
async fn two_handlers_for_one_kind_are_refused_at_start() {
    let err = Host::builder()
        .database_url("postgres://nobody@127.0.0.1:1/none")
        .job(handler_fn(|_: Job<SendEmail>| async { Ok(()) }))
        .job(handler_fn(|_: Job<SendEmail>| async { Ok(()) }))
        .handler(
            "mixed",
            handler_fn(|_: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await
        .err()
        .expect("refused");
    let HostError::Config(problems) = &err else {
        panic!("a configuration error: {err}");
    };
    let text = err.to_string();
    assert_eq!(problems.len(), 1, "{text}");
    assert!(
        text.contains("job kind \"send_email\" of queue \"mixed\" has more than one handler"),
        "{text}"
    );
}

/// A host whose claim loops never poll on a timer: with LISTEN healthy, only a wake signal
/// makes them claim. Its one queue, `watched`, runs until the item's token fires.
/// [`start_unpolled`], ready and listening (LISTEN healthy): only a wake starts a claim.
async fn start_listening(url: &str, ran: &Ran) -> HostHandle {
    let host = start_unpolled(url, ran).await;
    host.ready().await.expect("ready");
    wait_until(Duration::from_secs(10), "LISTEN is healthy", || async {
        host.health().listener_healthy
    })
    .await;
    host
}

/// Stops `host` (drained), closes `pool` and drops the database.
async fn stop(host: HostHandle, pool: sqlx::PgPool, db: workpump_testdb::TestDatabase) {
    host.shutdown();
    host.stopped().await.expect("drained");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

async fn start_unpolled(url: &str, ran: &Ran) -> HostHandle {
    start_unpolled_with(url, ran, |_| {}).await
}

/// [`start_unpolled`], its configuration changed by `tweak` first.
async fn start_unpolled_with(
    url: &str,
    ran: &Ran,
    tweak: impl FnOnce(&mut workpump_host::HostConfig),
) -> HostHandle {
    let mut config = fast_config();
    config.claim.safety_net_poll = false;
    tweak(&mut config);
    config.queues.insert(
        "watched".into(),
        QueueConfig {
            lease_ms: Some(3_000),
            renewal_interval_ms: Some(100),
            ..QueueConfig::default()
        },
    );
    let ran = ran.clone();
    Host::builder()
        .config(config)
        .database_url(url)
        .handler(
            "watched",
            handler_fn(move |job: Job<serde_json::Value>| {
                let ran = ran.clone();
                async move {
                    ran.lock()
                        .expect("ran")
                        .push(job.payload()["n"].to_string());
                    if job.payload()["wait"] == true {
                        job.cancellation_token().cancelled().await;
                        return Err(JobError::cancelled("stopped on request"));
                    }
                    Ok(())
                }
            }),
        )
        .start()
        .await
        .expect("the host starts")
}

#[tokio::test]
async fn an_item_enqueued_in_the_callers_transaction_wakes_the_claimers_at_its_commit() {
    let (db, pool) = database().await;
    let ran = Ran::default();
    let host = start_listening(db.url(), &ran).await;

    let mut tx = pool.begin().await.expect("begin");
    let out = host
        .enqueue_in(&mut tx, NewWork::new("watched", json!({ "n": 1 })))
        .await
        .expect("enqueue in the transaction");
    // Uncommitted, it is invisible: whatever woke a claim loop now found nothing.
    assert_eq!(count_state(&pool, "available").await, 0);
    tx.commit().await.expect("commit");
    // No timer polls: only the notification sent at commit can start the claim.
    wait_until(
        Duration::from_secs(10),
        "the committed item ran",
        || async { count_state(&pool, "completed").await == 1 },
    )
    .await;
    assert_eq!(*ran.lock().expect("ran"), ["1"]);
    assert!(out.inserted);

    stop(host, pool, db).await;
}

/// `enqueue_work` commits without notifying and sends the wake right after its commit: a
/// producer in another process (here a `Client`, which wakes no local claim loop) starts the
/// item on a host that never polls on a timer, and the item is committed and its wake sent
/// by the time the call returns.
#[tokio::test]
async fn an_item_a_client_enqueues_wakes_a_host_that_never_polls_after_its_commit() {
    let (db, pool) = database().await;
    let ran = Ran::default();
    let host = start_listening(db.url(), &ran).await;
    let client = Client::connect(db.url()).expect("a client");
    let out = client
        .enqueue(NewWork::new("watched", json!({ "n": 7 })))
        .await
        .expect("enqueue");
    assert!(out.inserted);
    // No timer polls and no local wake: only the wake sent after the commit starts the claim.
    wait_until(Duration::from_secs(10), "the enqueued item ran", || async {
        count_state(&pool, "completed").await == 1
    })
    .await;
    assert_eq!(*ran.lock().expect("ran"), ["7"]);

    stop(host, pool, db).await;
}

/// A `Client`'s transaction commits the caller's writes and its items together; the items
/// are invisible until the commit, and the wake sent after it starts them on a host that
/// never polls on a timer (a `Client` wakes no local loop). A caller's own transaction,
/// wrapped by the host, does the same.
#[tokio::test]
async fn a_transaction_commits_writes_and_items_together_and_wakes_the_claimers_after() {
    let (db, pool) = database().await;
    sqlx::query("CREATE TABLE orders (id int PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("a business table");
    let ran = Ran::default();
    let host = start_listening(db.url(), &ran).await;
    let client = Client::connect(db.url()).expect("a client");

    let mut tx = client.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders VALUES (1)")
        .execute(&mut *tx)
        .await
        .expect("the order");
    let item = tx
        .enqueue(NewWork::new("watched", json!({ "n": 8 })))
        .await
        .expect("enqueue");
    assert_eq!(tx.queues_to_wake(), ["watched".to_string()]);
    let visible: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work WHERE id = $1")
        .bind(item.id)
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(visible, 0, "not visible before the commit");
    tx.commit().await.expect("commit");
    wait_until(Duration::from_secs(10), "the item ran", || async {
        count_state(&pool, "completed").await == 1
    })
    .await;
    assert_eq!(*ran.lock().expect("ran"), ["8"]);

    let mut tx = host
        .transaction(pool.begin().await.expect("begin"))
        .await
        .expect("wrap");
    sqlx::query("INSERT INTO orders VALUES (2)")
        .execute(&mut *tx)
        .await
        .expect("the order");
    tx.enqueue(NewWork::new("watched", json!({ "n": 9 })))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    wait_until(Duration::from_secs(10), "the second item ran", || async {
        count_state(&pool, "completed").await == 2
    })
    .await;
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .expect("orders");
    assert_eq!(orders, 2);

    stop(host, pool, db).await;
}

/// A host's `Transaction` wakes the host's own claim loop at its commit, without NOTIFY: on a
/// host that does not LISTEN and polls once an hour, an item a `Client`'s transaction commits
/// (its wake is a NOTIFY nobody hears) stays waiting, and the host's own transaction's item
/// starts the loop, which then takes both.
#[tokio::test]
async fn a_hosts_transaction_wakes_its_own_claim_loop_at_the_commit() {
    let (db, pool) = database().await;
    let ran = Ran::default();
    let host = start_unpolled_with(db.url(), &ran, |c| {
        c.claim.listen = false;
        c.claim.poll_base_ms = 3_600_000;
        c.claim.poll_max_ms = 3_600_000;
    })
    .await;
    host.ready().await.expect("ready");

    let client = Client::connect(db.url()).expect("a client");
    let mut tx = client.begin().await.expect("begin");
    tx.enqueue(NewWork::new("watched", json!({ "n": 1 })))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    holds_for(
        Duration::from_secs(1),
        "the client's item waits (nobody listens, no poll due)",
        || async {
            match count_state(&pool, "available").await {
                1 => Ok(()),
                n => Err(format!("{n} available")),
            }
        },
    )
    .await;

    let mut tx = host.begin().await.expect("begin");
    tx.enqueue(NewWork::new("watched", json!({ "n": 2 })))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    wait_until(Duration::from_secs(10), "both items ran", || async {
        count_state(&pool, "completed").await == 2
    })
    .await;
    let mut ran = ran.lock().expect("ran").clone();
    ran.sort();
    assert_eq!(ran, ["1", "2"]);

    client.pg().expect("pg").pool().close().await;
    stop(host, pool, db).await;
}

/// A transaction rolled back, or dropped, leaves neither the caller's writes nor its items,
/// and wakes nobody: the next wake on the channel is a later enqueue's, to another queue.
#[tokio::test]
async fn a_transaction_rolled_back_or_dropped_leaves_nothing_and_wakes_nobody() {
    let (db, pool) = database().await;
    sqlx::query("CREATE TABLE orders (id int PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("a business table");
    let client = Client::connect(db.url()).expect("a client");
    let pg = client.pg().expect("the PostgreSQL store").clone();
    for q in ["first", "marker"] {
        pg.register_queue(workpump_coordinator::RegisterQueueParams::new(q))
            .await
            .expect("register");
    }
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("a listener");
    listener.listen("workpump.wake").await.expect("listen");

    let mut rolled_back = client.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders VALUES (1)")
        .execute(&mut *rolled_back)
        .await
        .expect("the order");
    rolled_back
        .enqueue(NewWork::new("first", json!(1)))
        .await
        .expect("enqueue");
    rolled_back.rollback().await.expect("rollback");
    let mut dropped = client.begin().await.expect("begin");
    dropped
        .enqueue(NewWork::new("first", json!(2)))
        .await
        .expect("enqueue");
    drop(dropped);

    client
        .enqueue(NewWork::new("marker", json!(3)))
        .await
        .expect("the marker");
    let first = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a wake within 10 s")
        .expect("the notification");
    assert_eq!(first.payload(), "marker", "no wake before the marker's");
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM workpump.work_all
                                                 WHERE queue = 'first')",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        left, 0,
        "no order and no item of the rolled-back transactions"
    );

    drop(listener);
    pg.pool().close().await;
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn an_operators_cancel_of_a_running_item_is_logged_at_info_with_the_handlers_reason() {
    let (db, pool) = database().await;
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let ran = Ran::default();
    let host = start_unpolled(db.url(), &ran).await;
    let item = host
        .enqueue(NewWork::new("watched", json!({ "n": 2, "wait": true })))
        .await
        .expect("enqueue");
    wait_until(Duration::from_secs(10), "the handler runs", || async {
        !ran.lock().expect("ran").is_empty()
    })
    .await;
    host.pg()
        .expect("pg")
        .cancel_work(workpump_coordinator::CancelWorkParams { id: item.id })
        .await
        .expect("cancel");
    wait_until(Duration::from_secs(10), "the item is cancelled", || async {
        count_state(&pool, "cancelled").await == 1
    })
    .await;
    // The worker logs the outcome once the store took it: moments after the row says so.
    let wanted = format!(
        "item {} of queue \"watched\" was cancelled: stopped on request",
        item.id
    );
    wait_until(Duration::from_secs(10), "the cancel is logged", || async {
        logs.text().contains(&wanted)
    })
    .await;
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains(&wanted))
        .unwrap_or_else(|| panic!("no cancel line: {text}"));
    assert!(line.contains("INFO"), "{line}");
    assert!(!text.contains("WARN") && !text.contains("ERROR"), "{text}");

    stop(host, pool, db).await;
}

/// Hooks that write every call into one list, with the item's kind.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl workpump_host::JobHooks for Journal {
    async fn claimed(&self, attempt: &workpump_host::Attempt) -> workpump_host::JobResult {
        self.0
            .lock()
            .expect("journal")
            .push(format!("claimed {}", attempt.id()));
        Ok(())
    }
    fn started(&self, attempt: &workpump_host::Attempt) {
        self.0
            .lock()
            .expect("journal")
            .push(format!("started {}", attempt.id()));
    }
    async fn ended(&self, attempt: &workpump_host::Attempt, ending: &workpump_host::Ending) {
        self.0
            .lock()
            .expect("journal")
            .push(format!("ended {}: {ending}", attempt.id()));
    }
}

#[tokio::test]
async fn the_hosts_hooks_and_layers_see_every_attempt_and_a_kinds_timeout_fails_it() {
    use tower::ServiceBuilder;
    use workpump_host::{service_handler, Handler};
    let (db, pool) = database().await;
    let journal = Journal::default();
    let layered = Arc::new(AtomicUsize::new(0));
    let l = layered.clone();
    let mut config = fast_config();
    config.queues.insert(
        "mixed".into(),
        QueueConfig {
            backoff_base_ms: Some(10),
            backoff_cap_ms: Some(20),
            ..QueueConfig::default()
        },
    );
    let email = handler_fn(|job: Job<SendEmail>| async move {
        if job.payload().to == "slow" && job.attempt() == 1 {
            // Never finishes on its own: only the timeout layer ends this attempt.
            std::future::pending::<()>().await;
        }
        Ok(())
    });
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .hooks(journal.clone())
        .layer(tower::util::MapRequestLayer::new(
            move |job: Job<serde_json::Value>| {
                l.fetch_add(1, Ordering::SeqCst);
                job
            },
        ))
        .job(service_handler(
            ServiceBuilder::new()
                .timeout(Duration::from_millis(300))
                .service(email.into_service()),
        ))
        .start()
        .await
        .expect("the host starts");
    let fast = host
        .enqueue(SendEmail { to: "a@b.c".into() })
        .await
        .expect("enqueue")
        .id;
    let slow = host
        .enqueue(SendEmail { to: "slow".into() })
        .await
        .expect("enqueue")
        .id;
    wait_until(Duration::from_secs(20), "both complete", || async {
        count_state(&pool, "completed").await == 2
    })
    .await;
    let lines = journal.0.lock().expect("journal").clone();
    let of = |id| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.ends_with(&format!(" {id}")) || l.contains(&format!(" {id}:")))
            .cloned()
            .collect()
    };
    assert_eq!(
        of(fast),
        vec![
            format!("claimed {fast}"),
            format!("started {fast}"),
            format!("ended {fast}: completed"),
        ]
    );
    assert_eq!(
        of(slow),
        vec![
            format!("claimed {slow}"),
            format!("started {slow}"),
            format!(
                "ended {slow}: failed (will be retried): the handler's service failed: request timed out"
            ),
            format!("claimed {slow}"),
            format!("started {slow}"),
            format!("ended {slow}: completed"),
        ]
    );
    // The global layer saw all three attempts.
    assert_eq!(layered.load(Ordering::SeqCst), 3);
    stop(host, pool, db).await;
}
