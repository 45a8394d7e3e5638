//! The scheduler's logic against the fake coordinator under paused tokio time: fire times
//! on time and once, several workers, misfires, a changed definition, failures; and the
//! fire-time arithmetic (intervals, cron in a time zone across DST).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    FakeCoordinator, Method, NewWork, RegisterQueueParams, WorkCoordinator, Worker,
};

use crate::{
    fire_key, Misfire, PeriodicConfig, PeriodicJob, Plans, SchedulerConfig, SchedulerWorker,
};

const SECOND: Duration = Duration::from_secs(1);

async fn store() -> FakeCoordinator {
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("register");
    fake
}

fn every(name: &str, interval: Duration, misfire: Misfire) -> PeriodicJob {
    PeriodicJob::every(name, interval, NewWork::new("q", json!({"job": name})))
        .expect("a valid job")
        .misfire(misfire)
}

fn worker(fake: &FakeCoordinator, jobs: Vec<PeriodicJob>) -> SchedulerWorker {
    SchedulerWorker::new(Arc::new(fake.clone()), jobs, SchedulerConfig::default())
}

/// Runs `worker` for `d` of tokio time, then stops it.
async fn run_for(worker: &SchedulerWorker, d: Duration) {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let run = worker.run(shutdown);
    let stopper = async move {
        tokio::time::sleep(d).await;
        stop.cancel();
    };
    let (result, ()) = tokio::join!(run, stopper);
    result.expect("the worker stops cleanly");
}

/// Unique key → how many items carry it.
fn keys(fake: &FakeCoordinator) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for row in fake.work_rows() {
        *out.entry(row.unique_key.expect("a periodic item has a key"))
            .or_default() += 1;
    }
    out
}

/// The fire times of `job` in `(after, until]`, as the keys their items carry.
fn expected(job: &PeriodicJob, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<String> {
    job.fire_times(after, until)
        .map(|t| fire_key(job.name(), t))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_interval_job_enqueues_each_fire_time_once_and_on_time() {
    let fake = store().await;
    let job = every("tick", SECOND, Misfire::Skip);
    let start = fake.now();
    run_for(
        &worker(&fake, vec![job.clone()]),
        Duration::from_millis(10_500),
    )
    .await;
    let want = expected(&job, start, fake.now());
    assert!((10..=11).contains(&want.len()), "{want:?}");
    let got = keys(&fake);
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);
    assert!(got.values().all(|n| *n == 1), "{got:?}");
    // One state read at start, then one call per fire time: no polling in between.
    assert_eq!(fake.calls_of(Method::FirePeriodic).len(), 1 + want.len());
    // The item is the declared one.
    let row = &fake.work_rows()[0];
    assert_eq!(row.queue, "q");
    assert_eq!(row.payload, json!({"job": "tick"}));
}

#[tokio::test(start_paused = true)]
async fn three_workers_on_one_store_enqueue_each_fire_time_exactly_once() {
    let fake = store().await;
    let job = every("tick", SECOND, Misfire::Skip);
    let start = fake.now();
    let workers: Vec<SchedulerWorker> = (0..3).map(|_| worker(&fake, vec![job.clone()])).collect();
    let d = Duration::from_millis(20_500);
    tokio::join!(
        run_for(&workers[0], d),
        run_for(&workers[1], d),
        run_for(&workers[2], d)
    );
    let want = expected(&job, start, fake.now());
    assert!((20..=21).contains(&want.len()), "{want:?}");
    let got = keys(&fake);
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);
    assert!(got.values().all(|n| *n == 1), "{got:?}");
}

/// What a stop across fire times left: the job, the keys expected before the stop, missed
/// while stopped and after the restart, and the keys the store holds.
struct Stopped {
    before: Vec<String>,
    missed: Vec<String>,
    after: Vec<String>,
    got: BTreeMap<String, usize>,
}

/// Runs the fleet (one worker) for 3.5 s, stops it for 10 s, and runs it again for 3 s,
/// under `misfire`.
async fn stop_across_fire_times(misfire: Misfire) -> Stopped {
    let fake = store().await;
    let job = every("tick", SECOND, misfire);
    let start = fake.now();
    run_for(
        &worker(&fake, vec![job.clone()]),
        Duration::from_millis(3_500),
    )
    .await;
    let stopped = fake.now();
    tokio::time::advance(Duration::from_secs(10)).await;
    let restarted = fake.now();
    run_for(
        &worker(&fake, vec![job.clone()]),
        Duration::from_millis(3_000),
    )
    .await;
    let got = keys(&fake);
    assert!(got.values().all(|n| *n == 1), "{got:?}");
    Stopped {
        before: expected(&job, start, stopped),
        missed: expected(&job, stopped, restarted),
        after: expected(&job, restarted, fake.now()),
        got,
    }
}

#[tokio::test(start_paused = true)]
async fn skip_enqueues_none_of_the_fire_times_missed_while_the_fleet_was_stopped() {
    let s = stop_across_fire_times(Misfire::Skip).await;
    assert_eq!(s.missed.len(), 10);
    let mut want = [s.before, s.after].concat();
    want.sort();
    assert_eq!(s.got.keys().cloned().collect::<Vec<_>>(), want);
}

#[tokio::test(start_paused = true)]
async fn run_once_enqueues_only_the_latest_missed_fire_time() {
    let s = stop_across_fire_times(Misfire::RunOnce).await;
    assert_eq!(s.missed.len(), 10);
    let latest = s.missed.last().expect("ten missed").clone();
    let mut want = [s.before, vec![latest], s.after].concat();
    want.sort();
    assert_eq!(s.got.keys().cloned().collect::<Vec<_>>(), want);
}

#[tokio::test(start_paused = true)]
async fn a_changed_definition_goes_on_after_the_last_fire_time_without_duplicates() {
    let fake = store().await;
    let old = every("tick", 2 * SECOND, Misfire::RunOnce);
    let new = every("tick", SECOND, Misfire::RunOnce);
    let start = fake.now();
    run_for(
        &worker(&fake, vec![old.clone()]),
        Duration::from_millis(6_500),
    )
    .await;
    let switched = fake.now();
    // A rolling deploy: an old and a new instance side by side, then the new one alone.
    let d = Duration::from_millis(3_000);
    let (old_instance, new_instance) = (
        worker(&fake, vec![old.clone()]),
        worker(&fake, vec![new.clone()]),
    );
    tokio::join!(run_for(&old_instance, d), run_for(&new_instance, d));
    let overlap_end = fake.now();
    run_for(
        &worker(&fake, vec![new.clone()]),
        Duration::from_millis(4_000),
    )
    .await;
    let got = keys(&fake);
    assert!(got.values().all(|n| *n == 1), "no fire time twice: {got:?}");
    let mut want = expected(&old, start, switched);
    // Overlap: the union of both definitions' fire times, each once (the 1 s ones include
    // the 2 s ones).
    want.extend(expected(&new, switched, overlap_end));
    want.extend(expected(&new, overlap_end, fake.now()));
    want.sort();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_longer_than_the_period_is_a_misfire_and_the_schedule_goes_on() {
    let fake = store().await;
    let job = every("tick", SECOND, Misfire::Skip);
    let w = worker(&fake, vec![job.clone()]);
    let mut plans = Plans::new();
    let first = w.run_once(&mut plans).await.expect("state read");
    assert_eq!(first.stepped, 1);
    let planned = plans.planned(0).expect("a fire time planned");
    assert!(planned > fake.now() && planned <= fake.now() + chrono::Duration::seconds(1));
    fake.set_unreachable(true);
    tokio::time::sleep_until(plans.next_wake().expect("a wake")).await;
    let failed = w.run_once(&mut plans).await.expect("logged, not returned");
    assert_eq!(failed.failed, 1);
    assert_eq!(plans.planned(0), Some(planned), "kept for the retry");
    // The job's part is degraded meanwhile, naming it.
    let parts = w.health().parts();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].0, "tick");
    match &parts[0].1 {
        workpump_coordinator::Condition::Degraded { last_error, .. } => {
            assert!(
                last_error.starts_with("periodic job \"tick\": "),
                "{last_error}"
            )
        }
        other => panic!("expected degraded, got {other:?}"),
    }
    tokio::time::advance(Duration::from_secs(3)).await;
    fake.set_unreachable(false);
    let back = w.run_once(&mut plans).await.expect("back");
    assert!(w.health().condition().is_healthy());
    assert_eq!((back.enqueued, back.missed), (0, 1), "{back:?}");
    assert!(plans.planned(0).expect("planned") > fake.now());
    tokio::time::sleep_until(plans.next_wake().expect("a wake")).await;
    let on_time = w.run_once(&mut plans).await.expect("on time");
    assert_eq!(on_time.enqueued, 1, "{on_time:?}");
    assert_eq!(fake.work_rows().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_long_wait_is_checked_against_the_store_clock_every_max_sleep() {
    let fake = store().await;
    let job = every("hourly", Duration::from_secs(3600), Misfire::Skip);
    let w = worker(&fake, vec![job]);
    let mut plans = Plans::new();
    w.run_once(&mut plans).await.expect("state read");
    let wake = plans.next_wake().expect("a wake");
    assert!(wake <= tokio::time::Instant::now() + Duration::from_secs(60));
}

#[test]
fn interval_fire_times_are_multiples_of_the_interval_since_the_epoch() {
    let job = every("i", Duration::from_secs(30), Misfire::Skip);
    let t = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 12).unwrap();
    assert_eq!(
        job.next_after(t),
        Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 30).unwrap())
    );
    let on = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 30).unwrap();
    assert_eq!(
        job.next_after(on),
        Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 1, 0).unwrap()),
        "strictly after"
    );
    assert_eq!(job.latest_at_or_before(on), Some(on));
    assert_eq!(job.fingerprint(), "every 30000 ms");
}

#[test]
fn cron_fire_times_follow_the_time_zone_across_daylight_saving_time() {
    let job = PeriodicJob::cron("nightly", "30 2 * * *", NewWork::new("q", json!({})))
        .expect("cron")
        .time_zone("Europe/Berlin")
        .expect("zone");
    assert_eq!(job.fingerprint(), "cron \"30 2 * * *\" in Europe/Berlin");
    // A winter day: 02:30 CET is 01:30 UTC.
    let jan = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
    assert_eq!(
        job.next_after(jan),
        Some(Utc.with_ymd_and_hms(2026, 1, 11, 1, 30, 0).unwrap())
    );
    // 29 March 2026: 02:00 CET jumps to 03:00 CEST, 02:30 does not exist; the job runs at
    // the first valid time after the gap, 03:00 CEST = 01:00 UTC, once.
    let before_spring = Utc.with_ymd_and_hms(2026, 3, 28, 12, 0, 0).unwrap();
    let spring = job.next_after(before_spring).expect("a fire time");
    assert_eq!(spring, Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap());
    assert_eq!(
        job.next_after(spring),
        Some(Utc.with_ymd_and_hms(2026, 3, 30, 0, 30, 0).unwrap())
    );
    // 25 October 2026: 03:00 CEST falls back to 02:00 CET, 02:30 happens twice; the job
    // runs once, at the first (00:30 UTC).
    let before_autumn = Utc.with_ymd_and_hms(2026, 10, 24, 12, 0, 0).unwrap();
    let autumn = job.next_after(before_autumn).expect("a fire time");
    assert_eq!(
        autumn,
        Utc.with_ymd_and_hms(2026, 10, 25, 0, 30, 0).unwrap()
    );
    assert_eq!(
        job.next_after(autumn),
        Some(Utc.with_ymd_and_hms(2026, 10, 26, 1, 30, 0).unwrap())
    );
}

#[test]
fn bad_declarations_are_refused_naming_the_problem() {
    let work = || NewWork::new("q", json!({}));
    let e = PeriodicJob::cron("j", "61 * * * *", work()).unwrap_err();
    assert!(
        e.to_string().contains("cron expression \"61 * * * *\""),
        "{e}"
    );
    let e = PeriodicJob::cron("j", "0 0 30 2 *", work()).unwrap_err();
    assert!(e.to_string().contains("no future fire time"), "{e}");
    let e = PeriodicJob::cron("j", "@daily", work())
        .expect("a nickname")
        .time_zone("Mars/Olympus")
        .unwrap_err();
    assert!(
        e.to_string().contains("unknown time zone \"Mars/Olympus\""),
        "{e}"
    );
    let e = PeriodicJob::every("j", Duration::from_millis(500), work()).unwrap_err();
    assert!(e.to_string().contains("between 1 s and 366 days"), "{e}");
    let e = PeriodicJob::every("j", SECOND, work())
        .expect("interval")
        .time_zone("UTC")
        .unwrap_err();
    assert!(e.to_string().contains("cron expressions only"), "{e}");
    let e = PeriodicJob::every("bad name", SECOND, work()).unwrap_err();
    assert!(e.to_string().contains("the name must be"), "{e}");
}

#[test]
fn a_configured_job_names_each_bad_setting() {
    let problems = |c: PeriodicConfig| {
        c.to_job("j", "periodic.j")
            .expect_err("refused")
            .into_iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    };
    let base = PeriodicConfig {
        queue: Some("q".into()),
        ..PeriodicConfig::default()
    };
    let p = problems(PeriodicConfig::default());
    assert!(p[0].starts_with("periodic.j.queue: is required"), "{p:?}");
    let p = problems(base.clone());
    assert!(p[0].contains("sets neither cron nor interval_ms"), "{p:?}");
    let p = problems(PeriodicConfig {
        cron: Some("* * *".into()),
        ..base.clone()
    });
    assert!(p[0].starts_with("periodic.j.cron: "), "{p:?}");
    let p = problems(PeriodicConfig {
        cron: Some("0 3 * * *".into()),
        timezone: Some("Nowhere/City".into()),
        ..base.clone()
    });
    assert!(p[0].starts_with("periodic.j.timezone: "), "{p:?}");
    let p = problems(PeriodicConfig {
        cron: Some("0 3 * * *".into()),
        kind: Some(String::new()),
        ..base.clone()
    });
    assert!(p[0].starts_with("periodic.j.kind: job kind"), "{p:?}");
    let job = PeriodicConfig {
        cron: Some("0 3 * * *".into()),
        timezone: Some("America/New_York".into()),
        misfire: Misfire::RunOnce,
        payload: Some(json!({"a": 1})),
        kind: Some("report".into()),
        ..base
    }
    .to_job("j", "periodic.j")
    .expect("valid");
    assert_eq!(job.misfire_policy(), Misfire::RunOnce);
    assert_eq!(job.work().payload, json!({"a": 1}));
    assert_eq!(job.work().kind.as_deref(), Some("report"));
    assert_eq!(job.fingerprint(), "cron \"0 3 * * *\" in America/New_York");
}

/// A job's typed arguments are the template: their kind, queue and defaults go with every
/// fire time; arguments that do not serialise are refused when the job is declared.
#[test]
fn a_typed_job_is_its_own_template_and_unserialisable_arguments_are_refused() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Digest {
        week: u32,
    }
    impl workpump_coordinator::JobArgs for Digest {
        const KIND: &'static str = "digest";
        const QUEUE: &'static str = "emails";
        const PRIORITY: i16 = 3;
    }
    let job = PeriodicJob::cron("digest", "0 9 * * MON", Digest { week: 1 }).expect("valid");
    let work = job.work();
    assert_eq!(
        (work.queue.as_str(), work.kind.as_deref(), work.priority),
        ("emails", Some("digest"), 3)
    );
    assert_eq!(work.payload, json!({"week": 1}));

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Broken {
        map: std::collections::HashMap<Vec<u8>, u8>,
    }
    impl workpump_coordinator::JobArgs for Broken {
        const KIND: &'static str = "broken";
    }
    let e = PeriodicJob::every(
        "broken",
        SECOND,
        Broken {
            map: [(vec![1], 1)].into_iter().collect(),
        },
    )
    .unwrap_err();
    assert!(
        matches!(&e, crate::ScheduleError::Work { name, .. } if name == "broken")
            && e.to_string().contains("do not serialise"),
        "{e}"
    );
}
