//! The test kit at work, as a service's own tests would use it: unit tests of a handler with a
//! built job (its outcome, its reaction to a cancel, its checkpoints), then, against
//! PostgreSQL, a producer's enqueue asserted by kind and payload, a queue drained through the
//! real claim path, and scheduled items made due.

use std::time::Duration;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use workpump_coordinator::testing::fresh_store;
use workpump_coordinator::{NewWork, Operations, WorkState};
use workpump_host::{handler_fn, Client, HostBuilder, Job, JobArgs, JobError};
use workpump_test::{
    run_job, run_json, CancelReason, DrainCounts, Error, JobBuilder, JobOutcome, TestKit,
};

// ---------------------------------------------------------------------------------------------
// The service under test: two job kinds, their handlers, a producer.

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
    subject: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
    const QUEUE: &'static str = "emails";
}

/// Imports `rows` rows, one unit at a time, saving its place as it goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Import {
    rows: u32,
}

impl JobArgs for Import {
    const KIND: &'static str = "import";
    const QUEUE: &'static str = "emails";
}

async fn send_email(job: Job<SendEmail>) -> Result<(), JobError> {
    let to = &job.payload().to;
    if to.is_empty() {
        return Err(JobError::dead_letter("no recipient"));
    }
    if to.ends_with("@flaky.example") && job.attempt() == 1 {
        return Err(JobError::retry("smtp: try again later"));
    }
    if to.ends_with("@unsubscribed.example") {
        return Err(JobError::cancelled("the recipient unsubscribed"));
    }
    Ok(())
}

async fn import(job: Job<Import>) -> Result<(), JobError> {
    let token = job.cancellation_token();
    let mut row = job.checkpoint::<u32>()?.unwrap_or(0);
    while row < job.payload().rows {
        tokio::select! {
            _ = token.cancelled() => {
                job.save_checkpoint(&row).await?;
                return Err(JobError::cancelled(format!("stopped at row {row}")));
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => row += 1, // one row's work
        }
    }
    Ok(())
}

/// The service's registration, shared by its `main` and its tests: its handlers, and its
/// queue's settings (a retry waits a minute or more, so none comes due during a drain).
fn jobs(builder: HostBuilder) -> HostBuilder {
    builder
        .job(handler_fn(send_email))
        .job(handler_fn(import))
        .configure(|c| {
            c.queues.entry("emails".into()).or_default().backoff_base_ms = Some(30_000);
        })
}

/// The producer: signing up enqueues a welcome email.
async fn sign_up(client: &Client, email: &str) -> Result<(), workpump_coordinator::Error> {
    client
        .enqueue(SendEmail {
            to: email.to_owned(),
            subject: "Welcome".to_owned(),
        })
        .await?;
    Ok(())
}

fn email(to: &str) -> SendEmail {
    SendEmail {
        to: to.to_owned(),
        subject: "Welcome".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Unit tests: a built job, a handler run inline, no database.

#[tokio::test]
async fn a_handler_run_inline_on_a_built_job_answers_each_outcome() {
    let handler = handler_fn(send_email);
    let run = |to: &str, attempt: i32| {
        let (job, _probe) = JobBuilder::new(email(to)).attempt(attempt).build();
        run_job(&handler, job)
    };
    assert_eq!(run("a@example.com", 1).await, JobOutcome::Completed);
    assert_eq!(
        run("", 1).await,
        JobOutcome::DeadLetter {
            message: "no recipient".into()
        }
    );
    assert_eq!(
        run("b@flaky.example", 1).await,
        JobOutcome::Retry {
            message: "smtp: try again later".into(),
            after: None
        }
    );
    assert_eq!(run("b@flaky.example", 2).await, JobOutcome::Completed);
    assert_eq!(
        run("c@unsubscribed.example", 1).await,
        JobOutcome::Cancelled {
            message: "the recipient unsubscribed".into()
        }
    );
}

#[tokio::test]
async fn a_built_job_carries_what_the_builder_was_given() {
    let created = chrono::DateTime::parse_from_rfc3339("2024-05-01T10:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let (job, _) = JobBuilder::new(Import { rows: 9 })
        .id(77)
        .attempt(3)
        .max_attempts(5)
        .created_at(created)
        .checkpoint(&4u32)
        .metadata(json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
        .build();
    assert_eq!(
        (
            job.id(),
            job.queue(),
            job.kind(),
            job.attempt(),
            job.max_attempts()
        ),
        (77, "emails", Some("import"), 3, 5)
    );
    assert_eq!(job.created_at(), created);
    assert_eq!(job.checkpoint::<u32>().unwrap(), Some(4));
    assert!(job.metadata().is_some_and(|m| m["traceparent"].is_string()));
    let e = job
        .begin_transaction()
        .await
        .err()
        .expect("no transaction without a store");
    assert!(e.message().contains("no store"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_import_saves_its_place_and_the_next_attempt_resumes_there() {
    let handler = handler_fn(import);
    let (job, probe) = JobBuilder::new(Import { rows: 10 }).build();
    // The host begins a drain 3.5 s into the run (paused time: exact).
    let (outcome, ()) = tokio::join!(run_job(&handler, job), async {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        probe.cancel(CancelReason::Shutdown);
    });
    assert_eq!(
        outcome,
        JobOutcome::Cancelled {
            message: "stopped at row 3".into()
        }
    );
    assert_eq!(probe.checkpoints(), vec![json!(3)]);

    let (job, probe) = JobBuilder::new(Import { rows: 10 })
        .attempt(2)
        .checkpoint(&3u32)
        .build();
    let started = tokio::time::Instant::now();
    assert_eq!(run_job(&handler, job).await, JobOutcome::Completed);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(7),
        "rows 3 to 9 only"
    );
    assert!(probe.checkpoints().is_empty());
}

#[tokio::test]
async fn a_panic_and_an_undecodable_payload_are_outcomes_too() {
    let panicky = handler_fn(|job: Job<SendEmail>| async move {
        if job.payload().to == "boom" {
            panic!("boom went the handler");
        }
        Ok(())
    });
    let (job, _) = JobBuilder::new(email("boom")).build();
    assert_eq!(
        run_job(&panicky, job).await,
        JobOutcome::Panicked {
            message: "boom went the handler".into()
        }
    );
    let (job, _) = JobBuilder::untyped(json!({"to": 5}))
        .queue("emails")
        .kind("send_email")
        .build();
    let outcome = run_json(&panicky, job).await;
    assert!(
        matches!(&outcome, JobOutcome::Undecodable { message } if message.contains("the payload does not match") && message.contains("SendEmail")),
        "{outcome:?}"
    );
    let (job, _) = JobBuilder::untyped(json!({"to": "a@b.c", "subject": "hi"})).build();
    assert_eq!(run_json(&panicky, job).await, JobOutcome::Completed);
}

// ---------------------------------------------------------------------------------------------
// Against PostgreSQL: what a producer enqueued, drains, the clock of scheduled items.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_enqueue_is_asserted_by_kind_and_payload() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone());
    kit.declare_queue(SendEmail::QUEUE).await.unwrap();
    kit.assert_not_enqueued::<SendEmail>().await;

    sign_up(&kit.client(), "ada@example.com").await.unwrap();

    assert_eq!(
        kit.enqueued::<SendEmail>().await.unwrap(),
        vec![email("ada@example.com")]
    );
    let item = kit.assert_enqueued(&email("ada@example.com")).await;
    assert_eq!(
        (item.state, item.kind.as_deref()),
        (WorkState::Available, Some("send_email"))
    );
    kit.assert_enqueued_where(|e: &SendEmail| e.to.starts_with("ada@"))
        .await;
    assert!(kit.enqueued::<Import>().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_assertion_lists_what_the_queue_holds() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone());
    kit.declare_queue("emails").await.unwrap();
    sign_up(&kit.client(), "ada@example.com").await.unwrap();
    kit.client()
        .enqueue(NewWork::new("emails", json!({"legacy": true})))
        .await
        .unwrap();

    let message = panic_message(kit.assert_enqueued(&email("bob@example.com"))).await;
    assert!(
        message.contains(r#"no unfinished item of kind "send_email" in queue "emails" has the payload {"subject":"Welcome","to":"bob@example.com"}"#),
        "{message}"
    );
    assert!(
        message.contains("holds 2 unfinished item(s)")
            && message.contains(r#"kind "send_email", available"#)
            && message.contains(r#""to":"ada@example.com""#)
            && message.contains(r#"untyped, available"#),
        "{message}"
    );
    let message = panic_message(kit.assert_not_enqueued::<SendEmail>()).await;
    assert!(
        message.contains(r#"queue "emails" holds unfinished items of kind "send_email""#),
        "{message}"
    );
}

async fn panic_message<T>(assertion: impl std::future::Future<Output = T>) -> String {
    let Err(panic) = std::panic::AssertUnwindSafe(assertion).catch_unwind().await else {
        panic!("the assertion held");
    };
    panic
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| "a non-string panic".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_runs_the_due_items_through_the_handlers_and_counts_how_they_ended() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone()).jobs(jobs);
    kit.declare_queue("emails").await.unwrap();
    let client = kit.client();
    client
        .enqueue_many([
            email("a@example.com"),
            email("b@example.com"),
            email(""),
            email("c@flaky.example"),
            email("d@unsubscribed.example"),
        ])
        .await
        .unwrap();
    client.enqueue(Import { rows: 0 }).await.unwrap();
    // A kind nobody handles: a failed attempt naming the kind, retried.
    client
        .enqueue(NewWork::new("emails", json!({})).kind("unknown_kind"))
        .await
        .unwrap();

    let counts = kit.drain("emails").await.unwrap();
    assert_eq!(
        counts,
        DrainCounts {
            completed: 3,
            retried: 2,
            dead: 1,
            cancelled: 1
        }
    );
    // The real outcomes, written through the real claim path.
    let failed = kit.enqueued::<SendEmail>().await.unwrap();
    assert_eq!(
        failed,
        vec![email("c@flaky.example")],
        "waiting for its retry"
    );
    let waiting = kit.unfinished("emails").await.unwrap();
    assert!(waiting.iter().all(|d| d.state == WorkState::Scheduled));
    let unknown = waiting
        .iter()
        .find(|d| d.kind.as_deref() == Some("unknown_kind"))
        .expect("the unknown kind waits for its retry");
    assert!(
        unknown.history[0].error.contains("no handler for job kind"),
        "{:?}",
        unknown.history
    );

    // Nothing is due now: a second drain runs nothing.
    assert_eq!(kit.drain("emails").await.unwrap(), DrainCounts::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_items_and_retries_are_made_due_on_demand() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone()).jobs(jobs);
    kit.declare_queue("emails").await.unwrap();
    let later = email("later@example.com")
        .to_work()
        .unwrap()
        .run_after(Duration::from_secs(3600));
    kit.client().enqueue(later).await.unwrap();
    kit.client()
        .enqueue(email("e@flaky.example"))
        .await
        .unwrap();

    // The flaky one fails its first attempt and is retried an exponential backoff away; the
    // one scheduled in an hour waits.
    assert_eq!(
        kit.drain("emails").await.unwrap(),
        DrainCounts {
            retried: 1,
            ..DrainCounts::default()
        }
    );
    assert_eq!(kit.enqueued::<SendEmail>().await.unwrap().len(), 2);

    // Made due now, both run: the retry as its second attempt.
    let counts = kit.drain("emails").with_scheduled(true).await.unwrap();
    assert_eq!(
        counts,
        DrainCounts {
            completed: 2,
            ..DrainCounts::default()
        }
    );
    kit.assert_not_enqueued::<SendEmail>().await;

    // run_now alone: the item is available and due at once, its attempts untouched.
    let id = kit
        .client()
        .enqueue(
            email("f@example.com")
                .to_work()
                .unwrap()
                .run_after(Duration::from_secs(600)),
        )
        .await
        .unwrap()
        .id;
    assert_eq!(kit.run_now("emails").await.unwrap(), 1);
    let item = kit
        .pg()
        .get_work(workpump_coordinator::GetWorkParams { id })
        .await
        .unwrap();
    assert_eq!(
        (item.item.state, item.item.attempt),
        (WorkState::Available, 0)
    );
    assert!(item.item.run_at <= item.now);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_without_handlers_for_its_queue_says_so() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone());
    let err = kit.drain("emails").await.unwrap_err();
    assert!(
        matches!(err, Error::NoJobs(ref q) if q == "emails"),
        "{err}"
    );

    let kit = kit.jobs(jobs);
    let err = kit.drain("reports").await.unwrap_err();
    assert!(
        matches!(&err, Error::NoHandler { queue, registered } if queue == "reports" && registered == "emails"),
        "{err}"
    );
}

/// Waits for its cancellation: what a hung handler looks like to a drain.
#[derive(Serialize, Deserialize)]
struct Hang {}

impl JobArgs for Hang {
    const KIND: &'static str = "hang";
    const QUEUE: &'static str = "slow";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_cannot_finish_gives_up_naming_what_was_left_and_a_paused_queue_is_refused() {
    let store = fresh_store().await;
    let kit = TestKit::new(store.coordinator.clone()).jobs(|builder| {
        builder.job(handler_fn(|job: Job<Hang>| async move {
            job.cancellation_token().cancelled().await;
            Err(JobError::cancelled("stopped"))
        }))
    });
    kit.declare_queue("slow").await.unwrap();
    kit.client().enqueue(Hang {}).await.unwrap();

    let err = kit
        .drain("slow")
        .timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    // Running, once the drain's host claimed it (it registers within a second or so).
    assert!(
        matches!(&err, Error::Timeout { queue, left, .. } if queue == "slow" && (left == "1 running" || left == "1 available")),
        "{err}"
    );
    // The drain's host released the item when it stopped, without using up the attempt.
    let item = &kit.unfinished("slow").await.unwrap()[0];
    assert_eq!((item.state, item.attempt), (WorkState::Available, 0));

    kit.pg()
        .pause_queue(workpump_coordinator::PauseQueueParams {
            queue: "slow".into(),
        })
        .await
        .unwrap();
    let err = kit.drain("slow").await.unwrap_err();
    assert!(matches!(&err, Error::Paused(q) if q == "slow"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kit_connected_by_url_migrates_the_database() {
    let (db, _pool) = workpump_coordinator::testing::fresh_database().await;
    let kit = TestKit::connect(db.url()).await.unwrap();
    kit.declare_queue("emails").await.unwrap();
    sign_up(&kit.client(), "ada@example.com").await.unwrap();
    kit.assert_enqueued(&email("ada@example.com")).await;
}
