//! Streaming standbys: made, streaming, promoted, and cleaned up on every path, on scratch
//! clusters of their own so that stopping a primary disturbs no other test. Concurrent runs
//! of this file (two `cargo test`s at once) take turns.

use std::fs::{self, File};
use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};
use workpump_testdb::{Cluster, Error, Replication, StopMode};

/// The primary only this file uses.
const PRIMARY: &str = "testdb-standby-primary";
/// Its standby.
const STANDBY: &str = "testdb-standby";

/// Stops a cluster however the test ends.
struct StopOnDrop<'a>(&'a Cluster);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

/// Holds a lock beside the scratch clusters until dropped.
fn take_turn(cluster: &Cluster) -> File {
    let base = cluster
        .data_dir()
        .parent()
        .and_then(Path::parent)
        .expect("clusters live two levels below a base directory");
    fs::create_dir_all(base).expect("the clusters' base directory");
    let file = File::create(base.join(format!("{PRIMARY}.tests.lock"))).expect("a lock file");
    file.lock().expect("our turn");
    file
}

fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether process `pid` is gone, or only a zombie waiting for its parent, within 10 s (the
/// postmaster removes its pid file, which `pg_ctl stop` waits for, just before it exits).
fn exits(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(") ")?.1.chars().next());
        if matches!(state, None | Some('Z' | 'X')) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// Runs `sql` on `url` and returns the first column of the first row as text.
fn ask(url: &str, sql: &str) -> Result<Option<String>, sqlx::Error> {
    block_on(async {
        let mut connection = PgConnection::connect(url).await?;
        let answer: Option<String> = sqlx::query_scalar(sql).fetch_one(&mut connection).await?;
        let _ = connection.close().await;
        Ok(answer)
    })
}

/// Runs the statements `sql` on `url`.
fn run(url: &str, sql: &str) -> Result<(), sqlx::Error> {
    block_on(async {
        let mut connection = PgConnection::connect(url).await?;
        sqlx::raw_sql(sql).execute(&mut connection).await?;
        let _ = connection.close().await;
        Ok(())
    })
}

fn skip_for_an_external_server() -> bool {
    let external = std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty());
    if external {
        eprintln!("skipped: DATABASE_URL is set, so no cluster is managed");
    }
    external
}

#[test]
fn a_synchronous_standby_streams_every_commit_and_takes_over_after_the_primary_crashes() {
    if skip_for_an_external_server() {
        return;
    }
    let primary = Cluster::new(PRIMARY, false).expect("the scratch primary");
    let _turn = take_turn(&primary);
    let _stop = StopOnDrop(&primary);
    primary.start().expect("the primary starts");
    let url = primary.tcp_url("postgres");
    run(&url, "DROP TABLE IF EXISTS t").expect("a clean table");
    run(&url, "CREATE TABLE t (id int)").expect("a table");
    run(&url, "INSERT INTO t VALUES (1)").expect("a first row");

    let standby = primary
        .start_standby(STANDBY, Replication::Synchronous)
        .expect("a synchronous standby");
    assert_ne!(standby.cluster().port(), primary.port());
    assert!(standby.is_in_recovery().expect("the standby answers"));
    let standby_url = standby.cluster().tcp_url("postgres");
    assert_eq!(
        ask(&standby_url, "SHOW transaction_read_only").expect("the standby answers"),
        Some("on".to_owned()),
        "a hot standby takes only read-only sessions"
    );

    // Committed on the primary under synchronous replication: on the standby at the crash.
    run(&url, "INSERT INTO t VALUES (2)").expect("a second row");
    primary
        .stop_with(StopMode::Immediate)
        .expect("the primary crashes");
    assert!(!primary.is_running());
    standby.promote().expect("the standby is promoted");
    assert!(!standby.is_in_recovery().expect("the new primary answers"));
    run(&standby_url, "INSERT INTO t VALUES (3)").expect("the new primary takes writes");
    assert_eq!(
        ask(
            &standby_url,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"
        )
        .expect("the rows"),
        Some("1,2,3".to_owned()),
        "nothing committed before the crash is lost"
    );
    assert_eq!(
        standby.failover_url("app"),
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/app?target_session_attrs=read-write",
            primary.port(),
            standby.cluster().port()
        )
    );

    let data_dir = standby.cluster().data_dir().to_owned();
    let pid = postmaster_pid(&data_dir).expect("the standby's postmaster");
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the standby runs"
    );
    standby.stop().expect("the standby stops");
    assert!(
        !data_dir.exists(),
        "the standby's data directory is removed"
    );
    assert!(exits(pid), "the standby's server is gone");

    // The old primary comes back on its own, without the synchronous standby it waited for:
    // a commit returns.
    primary.start().expect("the old primary starts again");
    assert_eq!(
        ask(&url, "SHOW synchronous_standby_names").expect("the primary answers"),
        Some(String::new())
    );
    run(&url, "INSERT INTO t VALUES (4)").expect("a commit without a standby");
    primary.stop().expect("the primary stops");
}

#[test]
fn a_dropped_standby_is_stopped_and_removed_and_the_primary_no_longer_waits_for_it() {
    if skip_for_an_external_server() {
        return;
    }
    let primary = Cluster::new(PRIMARY, false).expect("the scratch primary");
    let _turn = take_turn(&primary);
    let _stop = StopOnDrop(&primary);
    primary.start().expect("the primary starts");
    let url = primary.tcp_url("postgres");

    let (data_dir, pid) = {
        let standby = primary
            .start_standby(STANDBY, Replication::Synchronous)
            .expect("a synchronous standby");
        let data_dir = standby.cluster().data_dir().to_owned();
        (
            data_dir.clone(),
            postmaster_pid(&data_dir).expect("a postmaster"),
        )
        // Dropped here, as on a panic.
    };
    assert!(!data_dir.exists());
    assert!(exits(pid), "the standby's server is gone");
    assert_eq!(
        ask(&url, "SHOW synchronous_standby_names").expect("the primary answers"),
        Some(String::new()),
        "the primary's synchronous settings are taken back at once"
    );
    run(&url, "CREATE TEMP TABLE t AS SELECT 1").expect("a commit returns");

    // A standby of itself, or of a stopped primary, is refused with the reason.
    let same = primary.start_standby(PRIMARY, Replication::Asynchronous);
    assert!(matches!(same, Err(Error::Invalid { .. })));
    primary.stop().expect("the primary stops");
    let Err(error) = primary.start_standby(STANDBY, Replication::Asynchronous) else {
        panic!("a standby of a stopped primary must be refused");
    };
    assert!(
        error.to_string().contains("start it before its standby"),
        "{error}"
    );
}
