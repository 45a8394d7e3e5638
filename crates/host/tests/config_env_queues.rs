//! Queue settings from the environment (`WORKPUMP_QUEUES__<name>__<SETTING>`): the name keeps
//! its case, an alias with `NAME` stands for a name no variable can hold, durations read as
//! strings, and a bad `NAME` is refused naming the variable. One test in its own binary: it
//! sets process-wide environment variables.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use workpump_coordinator::FakeCoordinator;
use workpump_host::{handler_fn, Host, HostConfig, HostError, Job, Worker, WorkerContext};

use support::Idle;

fn noop() -> impl workpump_host::Handler<Payload = serde_json::Value> {
    handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) })
}

#[tokio::test]
async fn queue_names_in_variables_keep_their_case_and_an_alias_names_any_queue() {
    std::env::set_var("WORKPUMP_QUEUES__Emails__CONCURRENCY", "4");
    std::env::set_var("WORKPUMP_QUEUES__Emails__LEASE_MS", "90s");
    std::env::set_var("WORKPUMP_QUEUES__Emails__ASYNC_COMMIT", "true");
    std::env::set_var("WORKPUMP_QUEUES__BILLING__NAME", "billing.emails-v2:eu");
    std::env::set_var("WORKPUMP_QUEUES__BILLING__CONCURRENCY", "7");
    std::env::set_var("WORKPUMP_QUEUES__BILLING__BACKOFF_BASE_MS", "250ms");
    std::env::set_var("WORKPUMP_SHUTDOWN_SOFT_TIMEOUT_MS", "1m30s");
    let config = HostConfig::load(None).expect("loads");
    assert_eq!(
        config.queues.keys().collect::<Vec<_>>(),
        ["Emails", "billing.emails-v2:eu"]
    );
    assert_eq!(config.shutdown_soft_timeout_ms, 90_000);
    let emails = config.queue_settings("Emails");
    assert_eq!(emails.concurrency, 4);
    assert_eq!(emails.lease.lease, Duration::from_secs(90));
    assert!(emails.async_commit);
    let billing = config.queue_settings("billing.emails-v2:eu");
    assert_eq!(billing.concurrency, 7);
    assert_eq!(billing.backoff.base, Duration::from_millis(250));
    assert!(!billing.async_commit, "off unless set");

    // The host accepts them for its handlers' queues, and serves them with these settings.
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let record = seen.clone();
    let host = Host::builder()
        .config(config)
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("Emails", noop())
        .handler("billing.emails-v2:eu", noop())
        .claim_worker(move |ctx: &WorkerContext| {
            *record.lock().unwrap() = ctx
                .handlers()
                .queues()
                .map(|(q, s)| (q.to_owned(), s.concurrency))
                .collect();
            Arc::new(Idle("claim")) as Arc<dyn Worker>
        })
        .start()
        .await
        .expect("the host accepts the queues' settings");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("Emails".to_owned(), 4),
            ("billing.emails-v2:eu".to_owned(), 7)
        ]
    );
    host.shutdown();
    host.stopped().await.expect("stops");

    // A name in the wrong case is another queue: refused as one this host does not serve.
    let result = Host::builder()
        .config(HostConfig::load(None).expect("loads"))
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("emails", noop())
        .handler("billing.emails-v2:eu", noop())
        .start()
        .await;
    match result {
        Err(HostError::Config(problems)) => {
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].setting, "queues.Emails");
            assert!(problems[0].reason.contains("no handler"), "{problems:?}");
            assert!(
                problems[0]
                    .reason
                    .contains("case-sensitive: did you mean \"emails\"?"),
                "{problems:?}"
            );
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("started with settings for a queue it does not serve"),
    }

    // A NAME that is no queue name is refused, naming the variable; the error keeps
    // figment's as its source.
    std::env::set_var("WORKPUMP_QUEUES__BILLING__NAME", "billing emails");
    let err = HostConfig::load(None).expect_err("refused");
    let message = err.to_string();
    assert!(
        message.contains("WORKPUMP_QUEUES__BILLING__NAME=\"billing emails\" does not name a queue"),
        "{message}"
    );
    let source = std::error::Error::source(&err).expect("the figment error is the source");
    let HostError::ConfigLoad(figment_error) = &err else {
        panic!("not a load error: {err:?}");
    };
    assert_eq!(source.to_string(), figment_error.to_string());
    assert!(source.to_string().contains("does not name a queue"));

    // A duration that reads as none is refused naming the variable and the accepted forms.
    std::env::set_var("WORKPUMP_QUEUES__BILLING__NAME", "billing.emails-v2:eu");
    std::env::set_var("WORKPUMP_CLAIM__POLL_BASE_MS", "5 minutes");
    let message = HostConfig::load(None).expect_err("refused").to_string();
    assert!(
        message.contains("\"5 minutes\" is not a duration")
            && message.contains("WORKPUMP_CLAIM__POLL_BASE_MS")
            && message.contains("\"1m30s\""),
        "{message}"
    );
}
