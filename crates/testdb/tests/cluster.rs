//! The cluster lifecycle, on a scratch cluster of its own so that stopping it disturbs no
//! other test. Concurrent runs of this file (two `cargo test`s at once) take turns.

use std::fs::{self, File};
use std::sync::Barrier;
use std::thread;

use workpump_testdb::{Cluster, StopMode};

/// A cluster only this test file uses.
const SCRATCH: &str = "testdb-selftest";

/// Stops the scratch cluster however the test ends.
struct StopOnDrop<'a>(&'a Cluster);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

/// Holds a lock beside the scratch cluster until dropped, so that another process running
/// this test waits instead of stopping the cluster under us.
fn take_turn(cluster: &Cluster) -> File {
    let base = cluster
        .data_dir()
        .parent()
        .and_then(|dir| dir.parent())
        .expect("clusters live two levels below a base directory");
    fs::create_dir_all(base).expect("the clusters' base directory");
    let file = File::create(base.join(format!("{SCRATCH}.tests.lock"))).expect("a lock file");
    file.lock().expect("our turn");
    file
}

fn postmaster_pid(cluster: &Cluster) -> Option<u32> {
    let text = fs::read_to_string(cluster.data_dir().join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

fn current_database(url: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap_or_else(|error| panic!("connect to {url}: {error}"));
        sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut connection)
            .await
            .expect("current_database()")
    })
}

#[test]
fn a_cluster_starts_once_however_many_start_it_and_stops_idempotently() {
    if std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty()) {
        eprintln!("skipped: DATABASE_URL is set, so no cluster is managed");
        return;
    }
    let cluster = Cluster::new(SCRATCH, false).expect("the scratch cluster");
    let _turn = take_turn(&cluster);
    let _stop = StopOnDrop(&cluster);
    cluster.stop().expect("a first stop");
    assert!(!cluster.is_running());

    // Many starters at once (threads here; processes under nextest): one server results.
    let starters = 6;
    let barrier = Barrier::new(starters);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..starters)
            .map(|_| {
                scope.spawn(|| {
                    let cluster = Cluster::new(SCRATCH, false).expect("the scratch cluster");
                    barrier.wait();
                    cluster.start()
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("starter thread").expect("start");
        }
    });
    assert!(cluster.is_running());
    assert!(cluster.is_initialised());
    assert_ne!(cluster.port(), 0);
    let pid = postmaster_pid(&cluster).expect("a postmaster");

    // Starting a running cluster is a no-op.
    cluster.start().expect("a second start");
    assert_eq!(postmaster_pid(&cluster), Some(pid));

    // Both URL forms reach it.
    assert_eq!(current_database(&cluster.url("postgres")), "postgres");
    assert_eq!(current_database(&cluster.tcp_url("template1")), "template1");

    // A restart keeps the port and the URLs.
    let port = cluster.port();
    cluster.restart(StopMode::Immediate).expect("restart");
    assert_eq!(cluster.port(), port);
    assert_ne!(postmaster_pid(&cluster), Some(pid));
    assert_eq!(current_database(&cluster.url("postgres")), "postgres");

    cluster.stop().expect("stop");
    assert!(!cluster.is_running());
    assert_eq!(postmaster_pid(&cluster), None);
    cluster.stop().expect("stopping a stopped cluster");
}
