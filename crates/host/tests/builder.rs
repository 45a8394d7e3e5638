//! The builder resolves queue settings at start, refuses duplicate handlers, and `ready()`
//! resolves once the host is ready. On the in-memory store: no database needed.

use std::sync::Arc;
use std::time::Duration;

use workpump_coordinator::FakeCoordinator;
use workpump_host::{handler_fn, Host, HostError, Job, QueueConfig};

fn noop() -> impl workpump_host::Handler {
    handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) })
}

#[tokio::test]
async fn settings_changed_after_a_handler_was_added_still_apply_to_it() {
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .configure(|c| {
            c.queues.insert(
                "q".into(),
                QueueConfig {
                    concurrency: Some(0),
                    ..QueueConfig::default()
                },
            );
        })
        .start()
        .await
        .err()
        .expect("refused");
    match err {
        HostError::Config(problems) => {
            assert!(
                problems.iter().any(|p| p.setting == "queues.q.concurrency"),
                "{problems:?}"
            );
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn two_handlers_for_one_queue_are_refused() {
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .handler("q", noop())
        .start()
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("\"q\" has more than one handler"),
        "{err}"
    );
}

#[tokio::test]
async fn ready_resolves_once_the_host_is_ready_and_the_host_stays_live() {
    let host = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .start()
        .await
        .expect("start");
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");
    let health = host.health();
    assert!(
        health.ready && health.live && health.schema_ready,
        "{health}"
    );
    host.shutdown();
    tokio::time::timeout(Duration::from_secs(10), host.stopped())
        .await
        .expect("stopped in time")
        .expect("clean stop");
    let err = host.ready().await.unwrap_err();
    assert!(err.to_string().contains("stopped"), "{err}");
}
