//! The tracing example runs against PostgreSQL, and the handler's span continues the trace of
//! the span that enqueued the job (the trace context went through the item's metadata).

use std::time::Duration;

use workpump_coordinator::testing::{fresh_store, FreshStore};

#[tokio::test]
async fn the_tracing_example_continues_the_enqueuers_trace_in_the_handler() {
    let FreshStore { pool, db, .. } = fresh_store().await;
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_tracing"))
        .env("DATABASE_URL", db.url())
        .env("WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS", "250")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the example ends within 60 s")
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.rsplit(' ').next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{stdout}"))
    };
    let enqueued = trace("enqueued cat.png in trace ");
    let handled = trace("handled  cat.png in trace ");
    assert_eq!(enqueued.len(), 32, "a W3C trace id: {enqueued}");
    assert_ne!(
        enqueued,
        "0".repeat(32),
        "the enqueue ran in a sampled span"
    );
    assert_eq!(
        handled, enqueued,
        "the handler's span continues the enqueuer's trace"
    );
    // The exporter printed the handler's span, named as the docs say.
    assert!(stdout.contains("workpump.job"), "{stdout}");
    pool.close().await;
    db.drop_database().await.expect("drop");
}
