//! Multi-host URLs against real servers: a host that is down, a standby listed first, a
//! primary that turns read-only, and a failover to a promoted streaming standby. The
//! primaries and standbys these tests stop are scratch clusters of their own (one pair per
//! test); the shared test server is only ever a healthy host. Each test skips when
//! DATABASE_URL names an external server, since it manages servers of its own.

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{Connection, PgConnection};
use workpump_coordinator::*;
use workpump_testdb::{Cluster, Replication, StopMode};

/// The longest any wait here lasts.
const DEADLINE: Duration = Duration::from_secs(60);

fn external_server() -> bool {
    let external = std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty());
    if external {
        eprintln!("skipped: DATABASE_URL is set, and this test manages servers of its own");
    }
    external
}

/// Stops a scratch cluster however the test ends.
struct StopOnDrop<'a>(&'a Cluster);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.stop() {
            eprintln!("stopping cluster {}: {e}", self.0.name());
        }
    }
}

/// A scratch cluster, started, with a lock held beside it until the returned file is dropped
/// (so that two runs of this test at once take turns).
fn scratch(name: &str) -> (Cluster, File) {
    let cluster = Cluster::new(name, false).expect("a scratch cluster");
    let base = cluster
        .data_dir()
        .parent()
        .and_then(Path::parent)
        .expect("clusters live two levels below a base directory");
    fs::create_dir_all(base).expect("the clusters' base directory");
    let turn = File::create(base.join(format!("{name}.tests.lock"))).expect("a lock file");
    turn.lock().expect("our turn");
    blocking(|| cluster.start()).expect("the scratch cluster starts");
    (cluster, turn)
}

/// Runs blocking cluster work from a test on the multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs each of `statements` on one session on `url`, each in a transaction of its own.
async fn run(url: &str, statements: &[&str]) {
    let mut conn = PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    for sql in statements {
        sqlx::raw_sql(sql)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let _ = conn.close().await;
}

/// A fresh database on `cluster`, named like the shared server's.
async fn create_database(cluster: &Cluster) -> String {
    let name = format!("wp_{}", uuid::Uuid::new_v4().simple());
    run(
        &cluster.url("postgres"),
        &[&format!("CREATE DATABASE {name}")],
    )
    .await;
    name
}

/// A TCP port on 127.0.0.1 where nothing listens (connections are refused).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// A coordinator on `url` the way the host builds one: a main pool and a dedicated control
/// pool.
fn coordinator(url: &str) -> PgCoordinator {
    let c = PgCoordinator::connect_lazy(url, DEFAULT_SCHEMA, 4).expect("a valid URL");
    let control = c.dedicated_pool(2);
    c.with_control_pool(control)
}

fn heartbeat(me: InstanceId) -> RecordHeartbeatParams {
    RecordHeartbeatParams {
        instance: me,
        host: "test".into(),
        metadata: json!({}),
        stale_after: Duration::from_secs(30),
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    }
}

async fn enqueue(c: &PgCoordinator, items: usize) {
    c.enqueue_work(EnqueueWorkParams {
        items: (0..items)
            .map(|n| NewWork::new("q", json!({ "n": n })))
            .collect(),
    })
    .await
    .expect("enqueue");
}

async fn claim_one(c: &PgCoordinator, me: InstanceId) -> ClaimedWork {
    c.claim_work(ClaimWorkParams {
        instance: me,
        queues: vec!["q".into()],
        max_items: 1,
        lease: Duration::from_secs(60),
        async_commit: false,
    })
    .await
    .expect("claim")
    .items
    .into_iter()
    .next()
    .expect("one item")
}

/// Migrates, registers queue `q` and an instance, and checks that every kind of connection
/// works: the pools, the alive-lock session and the LISTEN session.
async fn set_up(c: &PgCoordinator) -> (InstanceId, TakeAliveLockOutcome, Box<dyn WakeListener>) {
    c.migrate().await.expect("migrate");
    c.register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("register a queue");
    let me = InstanceId::new();
    c.record_heartbeat(heartbeat(me))
        .await
        .expect("a heartbeat");
    let lock = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("the alive-lock session");
    assert!(lock.held, "the alive-lock is taken");
    let mut listener = c.listen(ListenParams::default()).await.expect("LISTEN");
    assert_eq!(
        next_event(&mut *listener).await,
        ListenEvent::Connected,
        "the listener connects"
    );
    (me, lock, listener)
}

async fn next_event(listener: &mut dyn WakeListener) -> ListenEvent {
    tokio::time::timeout(DEADLINE, listener.next_event())
        .await
        .expect("a listener event in time")
        .expect("a listener event")
}

/// The port and recovery state of the server behind each of `n` pool connections held at
/// once.
async fn servers_behind(pool: &sqlx::PgPool, n: usize) -> Vec<(i32, bool)> {
    let mut held = Vec::with_capacity(n);
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        let mut conn = pool.acquire().await.expect("a pool connection");
        let server: (i32, bool) = sqlx::query_as("SELECT inet_server_port(), pg_is_in_recovery()")
            .fetch_one(&mut *conn)
            .await
            .expect("the server answers");
        servers.push(server);
        held.push(conn);
    }
    servers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_whose_first_host_is_down_uses_the_second() {
    if external_server() {
        return;
    }
    let server = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server");
    let db = server.create_database().await.expect("a fresh database");
    let Some(cluster) = server.cluster() else {
        return;
    };
    let (dead, up) = (closed_port(), cluster.port());
    let c = coordinator(&format!(
        "postgres://postgres@127.0.0.1:{dead},127.0.0.1:{up}/{}?target_session_attrs=read-write",
        db.name()
    ));

    let (me, _lock, _listener) = set_up(&c).await;
    enqueue(&c, 1).await;
    claim_one(&c, me).await;
    assert_eq!(c.current_host(), Some(format!("127.0.0.1:{up}")));
    for (port, in_recovery) in servers_behind(c.pool(), 3).await {
        assert_eq!((port, in_recovery), (i32::from(up), false));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_with_no_host_up_fails_at_once_naming_every_host() {
    let (one, two) = (closed_port(), closed_port());
    let c = coordinator(&format!(
        "postgres://postgres@127.0.0.1:{one},127.0.0.1:{two}/app?target_session_attrs=read-write"
    ));
    let asked = Instant::now();
    let error = c
        .record_heartbeat(heartbeat(InstanceId::new()))
        .await
        .expect_err("no server, no heartbeat");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "refused connections fail the call at once, not after the pool's acquire timeout \
         ({:?})",
        asked.elapsed()
    );
    assert!(error.is_transient(), "a later call may find a server");
    let message = error.to_string();
    for port in [one, two] {
        assert!(
            message.contains(&format!("127.0.0.1:{port}: ")),
            "{message}"
        );
    }
    assert!(
        message.contains("target_session_attrs=read-write"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_standby_listed_first_is_skipped_under_read_write() {
    if external_server() {
        return;
    }
    let (primary, _turn) = scratch("coord-ro-primary");
    let _stop = StopOnDrop(&primary);
    let db = create_database(&primary).await;
    let standby = blocking(|| primary.start_standby("coord-ro-standby", Replication::Asynchronous))
        .expect("a streaming standby");
    let standby_port = standby.cluster().port();
    let c = coordinator(&format!(
        "postgres://postgres@127.0.0.1:{standby_port},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        primary.port()
    ));

    let (me, _lock, _listener) = set_up(&c).await;
    enqueue(&c, 1).await;
    claim_one(&c, me).await;
    assert_eq!(
        c.current_host(),
        Some(format!("127.0.0.1:{}", primary.port()))
    );
    for (port, in_recovery) in servers_behind(c.pool(), 3).await {
        assert_eq!((port, in_recovery), (i32::from(primary.port()), false));
    }

    blocking(|| standby.stop()).expect("the standby stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_turns_read_only_is_left_for_the_next_read_write_host() {
    if external_server() {
        return;
    }
    let server = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server");
    let shared = server.create_database().await.expect("a fresh database");
    let Some(shared_cluster) = server.cluster() else {
        return;
    };
    let (first, _turn) = scratch("coord-turns-read-only");
    let _stop = StopOnDrop(&first);
    let reset = [
        "SET default_transaction_read_only = off",
        "ALTER SYSTEM RESET default_transaction_read_only",
        "SELECT pg_reload_conf()",
    ];
    run(&first.url("postgres"), &reset).await;
    run(
        &first.url("postgres"),
        &[&format!("CREATE DATABASE {}", shared.name())],
    )
    .await;
    let c = coordinator(&format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
        first.port(),
        shared_cluster.port(),
        shared.name()
    ));
    // Both hosts hold the schema (as a primary and its promoted replacement would).
    let second_pool = shared.pool().await.expect("the shared server");
    migrate(&second_pool, DEFAULT_SCHEMA)
        .await
        .expect("migrate the second host");
    PgCoordinator::new(second_pool)
        .register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("register on the second host");
    let (me, _lock, _listener) = set_up(&c).await;
    assert_eq!(
        c.current_host(),
        Some(format!("127.0.0.1:{}", first.port()))
    );

    run(
        &first.url("postgres"),
        &[
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    // The reload is asynchronous: once a new session sees the setting, the postmaster has
    // re-read it and signalled every backend, so the pooled sessions apply it before their
    // next statement.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut probe = PgConnection::connect(&first.url("postgres"))
            .await
            .expect("connect to the first host");
        let read_only: String = sqlx::query_scalar("SHOW default_transaction_read_only")
            .fetch_one(&mut probe)
            .await
            .expect("read the setting");
        let _ = probe.close().await;
        if read_only == "on" {
            break;
        }
        assert!(Instant::now() < deadline, "the reload never took effect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut failures = 0;
    while let Err(e) = c.record_heartbeat(heartbeat(me)).await {
        failures += 1;
        assert!(e.is_transient(), "{e}");
        assert!(Instant::now() < deadline, "still failing: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("moved after {failures} failed calls");
    assert_eq!(
        c.current_host(),
        Some(format!("127.0.0.1:{}", shared_cluster.port()))
    );
    for (port, in_recovery) in servers_behind(c.pool(), 3).await {
        assert_eq!(
            (port, in_recovery),
            (i32::from(shared_cluster.port()), false)
        );
    }
    enqueue(&c, 1).await;
    claim_one(&c, me).await;

    run(&first.url("postgres"), &reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_calls_fail_for_a_while_then_reach_the_promoted_standby() {
    if external_server() {
        return;
    }
    let (primary, _turn) = scratch("coord-failover-primary");
    let _stop = StopOnDrop(&primary);
    let db = create_database(&primary).await;
    let standby =
        blocking(|| primary.start_standby("coord-failover-standby", Replication::Synchronous))
            .expect("a synchronous streaming standby");
    let c = coordinator(&standby.failover_url(&db));
    let (me, mut lock, mut listener) = set_up(&c).await;
    enqueue(&c, 2).await;
    let claimed = claim_one(&c, me).await;
    assert_eq!(
        c.current_host(),
        Some(format!("127.0.0.1:{}", primary.port()))
    );

    // The primary crashes.
    let crashed = Instant::now();
    blocking(|| primary.stop_with(StopMode::Immediate)).expect("the primary stops");
    tokio::time::timeout(DEADLINE, lock.session.lost())
        .await
        .expect("the alive-lock session sees its server go");
    let error = c
        .record_heartbeat(heartbeat(me))
        .await
        .expect_err("no primary, no heartbeat");
    let message = error.to_string();
    assert!(error.is_transient(), "{message}");
    assert!(message.contains("a standby (in recovery)"), "{message}");

    // The standby is promoted while calls keep coming, as a fleet's would.
    let handle = tokio::runtime::Handle::current();
    let (promotion, recovered) = blocking(|| {
        std::thread::scope(|scope| {
            let promotion = scope.spawn(|| {
                let began = Instant::now();
                standby.promote().map(|()| began.elapsed())
            });
            let recovered = handle.block_on(async {
                let mut failures = 1;
                loop {
                    match c.record_heartbeat(heartbeat(me)).await {
                        Ok(outcome) => return (crashed.elapsed(), failures, outcome),
                        Err(e) => {
                            failures += 1;
                            assert!(e.is_transient(), "{e}");
                            assert!(crashed.elapsed() < DEADLINE, "still failing: {e}");
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            (promotion.join(), recovered)
        })
    });
    let promotion = promotion
        .expect("the promoting thread")
        .expect("the standby is promoted");
    let (outage, failures, beat) = recovered;
    eprintln!(
        "failover: the first call succeeded {:.2} s after the primary stopped ({failures} calls \
         failed; the promotion took {:.2} s)",
        outage.as_secs_f64(),
        promotion.as_secs_f64()
    );
    assert!(!beat.evicted, "the instance lives on");
    assert_eq!(
        c.current_host(),
        Some(format!("127.0.0.1:{}", standby.cluster().port()))
    );

    // The new primary has everything the old one committed (synchronous replication), and
    // every kind of connection works there without rebuilding the coordinator.
    let renewed = c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![claimed.fence],
            lease: Duration::from_secs(60),
        })
        .await
        .expect("renew on the new primary");
    assert_eq!(renewed.items[0].status, RenewalStatus::Renewed);
    claim_one(&c, me).await;
    let relock = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("a new alive-lock session");
    assert!(relock.held, "the alive-lock is taken on the new primary");
    let beat = c
        .record_heartbeat(heartbeat(me))
        .await
        .expect("a heartbeat with the lock");
    assert!(!beat.evicted);
    let alive = c
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("the lock is visible");
    assert!(alive.alive);
    // The wake of the enqueue before the crash may come first.
    let mut event = next_event(&mut *listener).await;
    while event == (ListenEvent::Wake { queue: "q".into() }) {
        event = next_event(&mut *listener).await;
    }
    assert_eq!(event, ListenEvent::Disconnected);
    assert_eq!(next_event(&mut *listener).await, ListenEvent::Connected);
    enqueue(&c, 1).await;
    assert_eq!(
        next_event(&mut *listener).await,
        ListenEvent::Wake { queue: "q".into() }
    );
    for (port, in_recovery) in servers_behind(c.pool(), 3).await {
        assert_eq!(
            (port, in_recovery),
            (i32::from(standby.cluster().port()), false)
        );
    }

    blocking(|| standby.stop()).expect("the standby stops");
}
