//! The liveness scenarios: faults after which nobody may be judged dead (a failover to a
//! promoted standby among them), and the one fault (a process frozen inside its fenced
//! transaction) whose work must still come back within its lease. Each runs under the short
//! settings and the shipped defaults alike; every wait and bound below is derived from the
//! profile's settings ([`Timing`]).
//!
//! What they hold the code to (issue 11; docs/guarantees.md, findings 5–9): an instance is judged dead
//! only on evidence its judge gathered while it could itself see the server continuously —
//! a server restart, an outage, a backend crash, a failover or a lock blip is never evidence
//! that a client died; the lock grace applies on every path; a sweep never reaps its caller; a
//! frozen fenced transaction is bounded by its lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use workpump_testdb::{Replication, StopMode};

use super::fleet::{Life, Timing, WorkerSpec};
use super::harness::{Fault, Harness};
use super::proxy::Proxy;
use super::report::Recovery;
use super::scenarios::{holding_deadline, stopped_handlers_of, zombie_note, CONCURRENCY};
use super::store::{self, Mix};
use super::{Result, Rng};

/// A steady workload for a scenario that lasts `span_s`: items due uniformly over it, with
/// sleepers of a quarter to two thirds of the lease (renewed at least once at the defaults),
/// at a rate that keeps about `in_flight` sleepers running at any time — so that every fault
/// finds work in flight and an eviction would cost something.
fn steady_mix(t: &Timing, span_s: f64, in_flight: f64) -> Mix {
    let sleep_ms = (
        (t.lease_s * 250.0) as u64,
        ((t.lease_s * 2000.0 / 3.0) as u64).max(1_000),
    );
    let mean_s = (sleep_ms.0 + sleep_ms.1) as f64 / 2000.0;
    // 22 % of the items are sleepers (store::plan).
    let rate = in_flight / (0.22 * mean_s);
    let items = ((rate * span_s) as usize).clamp(50, 6_000);
    let mut mix = Mix::new(items, (span_s * 1000.0) as u64);
    mix.sleep_ms = sleep_ms;
    mix
}

/// Keeps work due while a scenario of unknown length runs (its faults wait for heartbeat
/// ages): the first chunk of a steady mix is the scenario's t = 0, and a task of the suite
/// enqueues the next chunk every chunk-length until [`Feeder::stop`] (or until dropped: it
/// is aborted), so that every fault finds work in flight and the work ends soon after the
/// last fault. Its choices come from its own generator, seeded from the scenario's.
pub(crate) struct Feeder {
    /// Taken by `stop`; aborted on drop otherwise.
    task: Option<tokio::task::JoinHandle<Result<()>>>,
    /// Asks the task to stop between two chunks (never inside an enqueue, whose ids must be
    /// recorded).
    stop: tokio::sync::watch::Sender<bool>,
    enqueued: Arc<AtomicUsize>,
    /// How many items the scenario cancels (of the first chunk).
    pub(crate) cancels: usize,
}

impl Drop for Feeder {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Feeder {
    /// The first chunk is a steady mix of about `in_flight` sleepers in flight.
    async fn start(h: &mut Harness<'_>, in_flight: f64) -> Result<Feeder> {
        let t = h.timing();
        let first = steady_mix(&t, (t.slow_s / 2.0).max(30.0), in_flight);
        Feeder::after(h, &first, 0.0, in_flight).await
    }

    /// Enqueues `first` (the scenario's t = 0), then, `delay_s` after its items are all
    /// due, keeps steady chunks coming (about `in_flight` sleepers in flight): a scenario
    /// that ends by then gets nothing more.
    pub(crate) async fn after(
        h: &mut Harness<'_>,
        first: &Mix,
        delay_s: f64,
        in_flight: f64,
    ) -> Result<Feeder> {
        let t = h.timing();
        let chunk_s = (t.slow_s / 2.0).max(30.0);
        let mix = steady_mix(&t, chunk_s, in_flight);
        h.enqueue(first).await?;
        let enqueued = Arc::new(AtomicUsize::new(0));
        let pool = h.db.pool.clone();
        let mut rng = Rng::new(h.rng.next_u64());
        let count = Arc::clone(&enqueued);
        let cancels = first.cancels;
        let first_s = first.spread_ms as f64 / 1000.0 + delay_s;
        let (stop, mut stopping) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let chunk = Duration::from_secs_f64(chunk_s);
            let mut next = Instant::now() + Duration::from_secs_f64(first_s);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = stopping.wait_for(|s| *s) => return Ok(()),
                }
                let planned = store::plan(&mut rng, &mix);
                let n = planned.len();
                // The server may be away (the scenario's own fault): enqueue once it answers.
                // (A retried enqueue whose first commit landed but whose reply was lost would
                // show as items the suite never enqueued; the window is one commit's round
                // trip, and the checks would report it rather than pass.)
                loop {
                    let up = sqlx::query("SELECT 1").execute(&pool).await.is_ok();
                    if up && store::enqueue(&pool, planned.clone()).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                count.fetch_add(n, Ordering::SeqCst);
                next += chunk;
            }
        });
        Ok(Feeder {
            task: Some(task),
            stop,
            enqueued,
            cancels,
        })
    }

    /// Stops feeding once the chunk being enqueued, if any, is in and recorded (within
    /// 150 s, or it is aborted); counts what it enqueued into the scenario's items.
    pub(crate) async fn stop(mut self, h: &mut Harness<'_>) -> Result<()> {
        self.stop.send_replace(true);
        if let Some(mut task) = self.task.take() {
            let within = Duration::from_secs(150);
            if tokio::time::timeout(within, &mut task).await.is_err() {
                task.abort();
                h.notes.push(
                    "the feeder did not stop within 150 s (the server away?); aborted".into(),
                );
            }
        }
        h.items += self.enqueued.load(Ordering::SeqCst);
        Ok(())
    }

    /// Stops feeding, then waits until every item finished, or the profile's finishing
    /// bound from now passes (the checks then report what was left).
    pub(crate) async fn finish(self, h: &mut Harness<'_>) -> Result<()> {
        self.stop(h).await?;
        let by = h.finish_by(h.timing().finish_s(h.elapsed()));
        h.wait_finished(by).await;
        Ok(())
    }
}

/// Waits (at most `within` seconds) until the workers' heartbeat ages, summarised by `of`,
/// lie in `lo..hi` seconds; that age, or None when they never
/// did. A server fault is timed by it: right after a beat, the next scheduled beat is as far
/// off as it gets; late in the slow cadence, every heartbeat is past stale_after.
async fn at_beat_age(
    h: &Harness<'_>,
    of: fn(&[f64]) -> Option<f64>,
    lo: f64,
    hi: f64,
    within: f64,
) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(within);
    while Instant::now() < deadline.min(h.deadline) {
        if let Some(age) = h.db.beat_ages().await.ok().as_deref().and_then(of) {
            if age >= lo && age < hi {
                return Some(age);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The youngest heartbeat: "some worker just beat" below a bound, "every heartbeat at
/// least this old" above one.
fn youngest(ages: &[f64]) -> Option<f64> {
    ages.iter().copied().reduce(f64::min)
}

/// After a server-side fault: measures how long until every live worker holds its
/// alive-lock again, listens again and some item completes; holds that against
/// [`Timing::comeback_s`]. `what` opens the recovery's detail (e.g. "server down 5.1 s").
pub(crate) async fn comeback(h: &mut Harness<'_>, label: String, what: &str) -> Option<f64> {
    let t = h.timing();
    let live = h.fleet.live().len() as i64;
    let bound = t.comeback_s();
    let give_up = (3.0 * bound).max(60.0);
    let up = Instant::now();
    let deadline = up + Duration::from_secs_f64(give_up);
    let mut up_db = None;
    let (mut locks_back, mut listen_back, mut work_back) = (None, None, None);
    while Instant::now() < deadline {
        if up_db.is_none() {
            up_db = h.db.now().await.ok();
        }
        if let Ok((locks, listening)) = h.db.sessions().await {
            let since = up.elapsed().as_secs_f64();
            if locks >= live && locks_back.is_none() {
                locks_back = Some(since);
            }
            if listening >= live && listen_back.is_none() {
                listen_back = Some(since);
            }
        }
        if let (Some(t), None) = (up_db, work_back) {
            if h.db.completed_since(t).await.is_ok_and(|n| n > 0) {
                work_back = Some(up.elapsed().as_secs_f64());
            }
        }
        if locks_back.is_some() && listen_back.is_some() && work_back.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fmt = |s: Option<f64>| {
        s.map(|s| format!("{s:.2} s"))
            .unwrap_or_else(|| format!("never ({give_up:.0} s)"))
    };
    h.say(&format!(
        "{what}; alive-locks {} / LISTEN {} / first completion {} later",
        fmt(locks_back),
        fmt(listen_back),
        fmt(work_back)
    ));
    let all = match (locks_back, listen_back, work_back) {
        (Some(a), Some(b), Some(c)) => Some(a.max(b).max(c)),
        _ => {
            h.violations.push(format!(
                "after the {label} the workers did not all come back within {give_up:.0} s \
                 (alive-locks {}, LISTEN {}, work {})",
                fmt(locks_back),
                fmt(listen_back),
                fmt(work_back)
            ));
            None
        }
    };
    h.recovery.push(Recovery {
        label,
        seconds: all,
        bound,
        bound_why: format!(
            "reconnect backoff (250 ms doubling) 10 s + a fast heartbeat interval {} s (the \
             lock is re-taken at least that often) + 2 s",
            t.fast_s
        ),
        detail: format!(
            "{what}; then every alive-lock held again after {}, every LISTEN after {}, first \
             completion after {}",
            fmt(locks_back),
            fmt(listen_back),
            fmt(work_back)
        ),
    });
    all
}

/// Fast stops of PostgreSQL with outages of 1 s, 5 s and `stale_after` + 15 s (quick: the
/// last two), three workers running. After each, the suite watches for
/// [`Timing::settle_s`] (stale after + lock grace + 2 sweeps + 5 s) from the moment the
/// server is back, so that an eviction the outage causes, if one is coming, happens inside
/// the scenario. Nobody may be evicted; the work ends once.
pub(crate) async fn pg_outage(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let outages: Vec<f64> = if h.quick {
        vec![5.0, t.stale_after_s + 15.0]
    } else {
        vec![1.0, 5.0, t.stale_after_s + 15.0]
    };
    let specs = (0..3).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let feeder = Feeder::start(h, 15.0).await?;
    h.at(2.0).await;
    h.cancel_some(feeder.cancels).await?;
    for down_s in outages {
        let in_flight = h.wait_running(holding_deadline(h)).await;
        // Right after a heartbeat: the next scheduled one is a whole slow interval away.
        let fresh = t.slow_s / 24.0;
        let age = at_beat_age(h, youngest, 0.0, fresh, t.slow_s + t.fast_s + 10.0).await;
        h.mark(&format!(
            "fast stop of PostgreSQL for {down_s:.0} s, {in_flight} items running, {}",
            age.map_or(
                format!("no heartbeat seen younger than {fresh:.2} s"),
                |a| { format!("right after a heartbeat ({a:.2} s old)") }
            )
        ));
        let label = format!("outage (fast stop, {down_s:.0} s down)");
        if in_flight == 0 {
            h.violations.push(format!(
                "vacuous: no item was running at the {label}, so it tested nothing"
            ));
        }
        let began = Instant::now();
        let cluster = h.cluster;
        tokio::task::block_in_place(|| cluster.stop())?;
        tokio::time::sleep(Duration::from_secs_f64(down_s)).await;
        tokio::task::block_in_place(|| cluster.start())?;
        let back = Instant::now();
        let down = began.elapsed().as_secs_f64();
        h.mark(&format!("PostgreSQL back after {down:.2} s"));
        comeback(h, label, &format!("server down {down:.2} s")).await;
        h.watch_settle(back, "the server's return").await;
    }
    feeder.finish(h).await?;
    Ok(())
}

/// SIGKILL one server backend (a worker's, chosen at random), as the OOM killer would: the
/// postmaster terminates every other session, runs crash recovery and accepts connections
/// again, without restarting itself (`pg_postmaster_start_time()` does not change). Each
/// crash comes when every heartbeat is past stale_after where the cadence allows it (so
/// that only the alive-locks vouch for the instances), and one of the three workers, behind
/// the proxy, reconnects 2/3 of the lock grace late. The workers must come back and nobody
/// may be evicted, watched as after an outage. A full run crashes twice.
pub(crate) async fn backend_crash(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let crashes = if h.quick { 1 } else { 2 };
    let refuse = t.lock_grace_s * 2.0 / 3.0;
    let proxy = Proxy::start(h.cluster.port()).await?;
    let mut specs: Vec<WorkerSpec> = (0..2).map(|_| h.direct(CONCURRENCY)).collect();
    let mut behind = WorkerSpec::new(h.profile, proxy.port(), CONCURRENCY);
    behind.label = Some(format!(
        "behind the proxy on port {}: reconnects {refuse:.1} s late after each crash",
        proxy.port()
    ));
    specs.push(behind);
    h.proxy = Some(proxy);
    h.start_workers(specs).await?;
    let slow_one = h.fleet.procs[h.fleet.procs.len() - 1].name.clone();
    let feeder = Feeder::start(h, 15.0).await?;
    h.at(2.0).await;
    h.cancel_some(feeder.cancels).await?;
    for k in 0..crashes {
        let in_flight = h.wait_running(holding_deadline(h)).await;
        // Late in the slow cadence: every heartbeat past stale_after where the cadence
        // allows it (at the defaults), so that only the locks keep the instances alive.
        let old = (t.stale_after_s + t.sweep_s).min(0.9 * t.slow_s);
        let age = at_beat_age(h, youngest, old, f64::MAX, t.slow_s + 10.0).await;
        let backends = h.db.worker_backends().await?;
        if backends.is_empty() {
            return Err("no worker backend to kill".into());
        }
        let (pid, app) = backends[h.rng.below(backends.len())].clone();
        let label = format!("backend crash #{} (SIGKILL {app}'s backend {pid})", k + 1);
        h.mark(&format!(
            "{label}, {in_flight} items running, {}",
            age.map_or(format!("not every heartbeat {old:.1} s old yet"), |a| {
                format!("every heartbeat at least {a:.1} s old")
            })
        ));
        if in_flight == 0 {
            h.violations.push(format!(
                "vacuous: no item was running at the {label}, so it tested nothing"
            ));
        }
        let began = Instant::now();
        let cluster = h.cluster;
        let pid_u32 = u32::try_from(pid).map_err(|_| format!("backend pid {pid}"))?;
        // One worker reconnects late (a loaded client, a pool at its limit): its new
        // connections are refused for 2/3 of the lock grace from the crash.
        if let Some(p) = &h.proxy {
            p.set_refusing(true);
        }
        tokio::task::block_in_place(|| cluster.kill_backend(pid_u32))?;
        let refused_until = began + Duration::from_secs_f64(refuse);
        // The postmaster resets every other session and recovers: wait until it answers
        // again with none of them left. Sessions that survive for good mean the fault tested
        // nothing.
        let others: Vec<i32> = backends
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p != pid)
            .collect();
        let deadline = began + Duration::from_secs(60);
        let mut survived = others.clone();
        loop {
            if let Ok(left) = h.db.surviving(&others).await {
                survived = left;
                if survived.is_empty() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let back = Instant::now();
        let down = began.elapsed().as_secs_f64();
        if !survived.is_empty() {
            h.violations.push(format!(
                "vacuous: 60 s after the {label}, {} of the other {} worker sessions still \
                 existed (no crash recovery)",
                survived.len(),
                others.len()
            ));
        }
        h.mark(&format!(
            "PostgreSQL answers again {down:.2} s after the kill, {} of {} other sessions \
             left",
            survived.len(),
            others.len()
        ));
        tokio::time::sleep_until(refused_until).await;
        let refused = h.proxy.as_ref().map_or(0, |p| {
            p.set_refusing(false);
            p.refused()
        });
        h.say(&format!(
            "{slow_one}'s new connections accepted again, {refuse:.1} s after the crash \
             ({refused} refused so far)"
        ));
        comeback(h, label, &format!("server recovered after {down:.2} s")).await;
        h.watch_settle(back, "the server's return").await;
    }
    feeder.finish(h).await?;
    Ok(())
}

/// One worker (behind the proxy) loses its alive-lock session — `pg_terminate_backend` on
/// the pid holding its key — exactly when its last heartbeat is 0, 1/3, 7/12 and 11/12 of
/// the slow cadence old (at the defaults 0 s, 20 s, 35 s and 55 s: the last two past
/// stale_after), and its new connections are refused for 2/3 of the lock grace while its
/// open ones carry on. The age is checked in the statement that kills the session. After
/// each blip the suite watches for the lock grace + 2 sweeps + 2 s. It must never be
/// evicted; a blip that cannot be landed at its age is a vacuous run, not a pass. Quick:
/// the two ages past the middle of the slow cadence.
pub(crate) async fn lock_blip(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let fractions: &[(f64, &str)] = if h.quick {
        &[(7.0 / 12.0, "7/12"), (11.0 / 12.0, "11/12")]
    } else {
        &[
            (0.0, "0"),
            (1.0 / 3.0, "1/3"),
            (7.0 / 12.0, "7/12"),
            (11.0 / 12.0, "11/12"),
        ]
    };
    // The window an age must be hit in: 1/24 of the slow cadence (2.5 s at the defaults).
    let tolerance = t.slow_s / 24.0;
    let refuse = t.lock_grace_s * 2.0 / 3.0;
    let watch = t.lock_grace_s + 2.0 * t.sweep_s + 2.0;
    // Reaching an age may take a whole slow interval, plus the fast ones after a blip.
    let reach = 2.0 * t.slow_s + t.fast_s + 10.0;

    // Few handlers each, kept busy: the worker behind the proxy (slower to claim) holds
    // leases at every blip too, so an eviction would cost something.
    let concurrency = 6;
    let proxy = Proxy::start(h.cluster.port()).await?;
    let mut specs: Vec<WorkerSpec> = (0..2).map(|_| h.direct(concurrency)).collect();
    let mut behind = WorkerSpec::new(h.profile, proxy.port(), concurrency);
    behind.label = Some(format!("behind the proxy on port {}", proxy.port()));
    specs.push(behind);
    h.proxy = Some(proxy);
    h.start_workers(specs).await?;
    let victim = h.fleet.procs.len() - 1;
    let name = h.fleet.procs[victim].name.clone();
    let feeder = Feeder::start(h, 14.0).await?;
    h.say(&format!(
        "{name}'s alive-lock session will be killed at heartbeat ages {} s (± {tolerance:.2} s), \
         its new connections refused for {refuse:.1} s each time (lock grace {} s)",
        fractions
            .iter()
            .map(|(f, _)| format!("{:.2}", f * t.slow_s))
            .collect::<Vec<_>>()
            .join(", "),
        t.lock_grace_s
    ));
    h.at(2.0).await;
    h.cancel_some(feeder.cancels).await?;

    for (k, &(fraction, written)) in fractions.iter().enumerate() {
        let age = fraction * t.slow_s;
        let label = format!(
            "lock blip #{} at heartbeat age {age:.2} s ({written} of the slow cadence)",
            k + 1
        );
        h.wait_holding(victim, holding_deadline(h)).await;
        let deadline = Instant::now() + Duration::from_secs_f64(reach);
        let mut last_age = None;
        let landed = loop {
            if Instant::now() >= deadline.min(h.deadline) {
                break None;
            }
            let Some(instance) = h.db.instance_named(&name).await.ok().flatten() else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let Ok(Some(now_age)) = h.db.beat_age(instance).await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            last_age = Some(now_age);
            // Only while it holds a lease, so that an eviction would cost something: a
            // window in which it holds none is left for the next slow interval's.
            let holding = now_age >= age
                && now_age < age + tolerance
                && h.leases_of(victim).await.is_ok_and(|(_, l)| !l.is_empty());
            if holding {
                // Refuse first, so that the worker cannot reconnect in between; the age is
                // checked again inside the killing statement.
                if let Some(p) = &h.proxy {
                    p.set_refusing(true);
                }
                let refused_before = h.proxy.as_ref().map_or(0, Proxy::refused);
                match h
                    .db
                    .kill_lock_session_at_age(instance, &name, age, age + tolerance)
                    .await
                {
                    Ok(Some(hit)) => break Some((instance, hit, refused_before, Instant::now())),
                    other => {
                        if let Some(p) = &h.proxy {
                            p.set_refusing(false);
                        }
                        other?;
                    }
                }
            }
            // Far from the window: poll less often (the age grows by the database clock).
            let wait = if now_age < age - 1.0 {
                (age - 1.0 - now_age).min(1.0)
            } else {
                0.02
            };
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        };
        let Some((instance, (hit_age, pid, terminated), refused_before, at)) = landed else {
            h.violations.push(format!(
                "vacuous: the {label} never landed: within {reach:.0} s {name}'s heartbeat was \
                 never between {age:.2} and {:.2} s old while a session of its own held its \
                 alive-lock and it held a lease (last age seen: {})",
                age + tolerance,
                last_age.map_or("none".into(), |a| format!("{a:.2} s"))
            ));
            continue;
        };
        let held = h.leases_of(victim).await.map(|(_, l)| l.len()).unwrap_or(0);
        let still = h.db.lock_holder(instance).await?;
        h.mark(&format!(
            "{label}: pg_terminate_backend({pid}) on {name}'s alive-lock session at age \
             {hit_age:.2} s ({}), {held} leases held; new connections refused for {refuse:.1} s",
            if terminated {
                "gone"
            } else {
                "NOT gone within 5 s"
            }
        ));
        if !terminated || still.as_ref().is_some_and(|(p, _)| *p == pid) {
            h.violations.push(format!(
                "vacuous: the {label} did not take the lock away (session {pid} still holds it)"
            ));
        }
        if held == 0 {
            h.violations.push(format!(
                "vacuous: {name} held no lease at the {label}: an eviction would have cost \
                 nothing"
            ));
        }
        tokio::time::sleep_until(at + Duration::from_secs_f64(refuse)).await;
        let refused = h.proxy.as_ref().map_or(0, |p| {
            p.set_refusing(false);
            p.refused() - refused_before
        });
        h.say(&format!(
            "{name}'s new connections accepted again ({refused} refused meanwhile)"
        ));
        // When does it hold its lock again (under whatever instance it runs as now)?
        let lock_deadline = at + Duration::from_secs_f64(refuse + t.fast_s + 10.0);
        let mut lock_back = None;
        while Instant::now() < lock_deadline {
            let current = h.db.instance_named(&name).await.ok().flatten();
            if let Some(current) = current {
                if let Ok(Some((_, app))) = h.db.lock_holder(current).await {
                    if app == name {
                        lock_back = Some(at.elapsed().as_secs_f64());
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        h.recovery.push(Recovery {
            label: label.clone(),
            seconds: lock_back,
            bound: refuse + t.fast_s + 2.0,
            bound_why: format!(
                "new connections refused {refuse:.1} s + a fast heartbeat interval {} s (the \
                 lock is re-taken at least that often) + 2 s",
                t.fast_s
            ),
            detail: format!(
                "{name}'s alive-lock back after {}; {refused} connections refused; {held} \
                 leases held at the blip",
                lock_back.map_or("never".into(), |s| format!("{s:.2} s"))
            ),
        });
        if lock_back.is_none() {
            h.violations.push(format!(
                "after the {label}, {name} did not hold its alive-lock again within {:.0} s",
                refuse + t.fast_s + 10.0
            ));
        }
        h.watch_until(
            at + Duration::from_secs_f64(refuse + watch),
            "the refusal, the lock grace, 2 sweeps and 2 s",
        )
        .await;
    }
    feeder.finish(h).await?;
    Ok(())
}

/// A worker SIGSTOPped inside its fenced transaction: an item `{"kind":"tx","hold_ms":..}`
/// holds its open transaction (`lock_lease` taken, the effect inserted) for half a lease on
/// its first attempt; the suite finds that session in `pg_stat_activity` (idle in
/// transaction, the item's marker as its last query), checks that the row is locked, and
/// stops the process owning it for the bound + 5 s. The item must be claimed anew within
/// the bound — the lease, 1.5 sweeps (the fleet's look for lapsed leases, taken in turns, then
/// the release), the longest claim poll wait and 2 s, as for any frozen process —
/// while the process is still stopped, and its effect must exist once.
pub(crate) async fn frozen_tx(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let hold_ms = (t.lease_s * 500.0) as u64;
    let (bound, bound_why) = t.lapsed_lease_bound();
    let freeze = bound + 5.0;
    let span = 5.0 + t.lease_s / 2.0 + freeze + 5.0;
    let specs = (0..3).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mix = steady_mix(&t, span, 10.0);
    h.enqueue(&mix).await?;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    h.wait_running(holding_deadline(h)).await;

    let item = store::enqueue_one(
        &h.db,
        json!({ "kind": "tx", "hold_ms": hold_ms, "times": 1 }),
    )
    .await?;
    h.items += 1;
    h.say(&format!(
        "enqueued item {item}: a tx item that holds its fenced transaction open for {} s",
        hold_ms as f64 / 1000.0
    ));
    let find_by = Instant::now() + Duration::from_secs_f64(t.poll_max_s + t.sweep_s + 5.0);
    let (pid, app) = loop {
        if let Some(found) = h.db.holding_session(item).await? {
            break found;
        }
        if Instant::now() >= find_by {
            h.violations.push(format!(
                "vacuous: no session was seen holding item {item}'s fenced transaction within \
                 {:.0} s of its enqueue",
                t.poll_max_s + t.sweep_s + 5.0
            ));
            let by = h.finish_by(t.finish_s(span));
            h.wait_finished(by).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some(victim) = h.fleet.procs.iter().position(|p| p.name == app) else {
        return Err(
            format!("item {item}'s transaction runs in {app}, not a worker of the suite").into(),
        );
    };
    let locked = h.db.row_locked(item).await?;
    let (state, token) = h.db.claim_of(item).await?;
    let token = token.ok_or_else(|| format!("item {item} is {state} without a claim token"))?;
    let before = stopped_handlers_of(h, victim).await;
    let at = h.db.now().await?;
    h.fleet.signal(victim, "STOP").await?;
    let stopped = Instant::now();
    let (instances, _) = h.leases_of(victim).await?;
    let inside =
        h.db.holding_session(item)
            .await?
            .is_some_and(|(p, _)| p == pid);
    h.mark(&format!(
        "SIGSTOP {app} inside the fenced transaction of item {item} (session {pid}, {state}, \
         token {token}, row locked: {locked}) for {freeze:.0} s"
    ));
    if !locked || !inside || state != "running" {
        h.violations.push(format!(
            "vacuous: {app} was not frozen inside a fenced transaction holding item {item}'s \
             row (row locked: {locked}, still in the transaction: {inside}, state {state})"
        ));
    }
    h.faults.push(Fault {
        label: format!("SIGSTOP {app} inside item {item}'s fenced transaction"),
        at,
        until: None,
        procs: vec![app.clone()],
        instances,
        affected: vec![(item, token)],
        bound,
        bound_why,
    });
    // While it is stopped: is the item claimed anew?
    let thaw = stopped + Duration::from_secs_f64(freeze);
    let mut reclaimed = None;
    while Instant::now() < thaw {
        if let Ok((_, now_token)) = h.db.claim_of(item).await {
            if now_token != Some(token) {
                reclaimed = Some(stopped.elapsed().as_secs_f64());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match reclaimed {
        Some(s) => h.say(&format!(
            "item {item} claimed anew {s:.1} s after the freeze (bound {bound:.0} s)"
        )),
        None => {
            let still_locked = h.db.row_locked(item).await.unwrap_or(false);
            h.violations.push(format!(
                "frozen fenced transaction: item {item} was not claimed anew during the \
                 {freeze:.0} s that {app} stayed frozen inside its transaction (bound \
                 {bound:.0} s); its row still locked at the end: {still_locked} — claim_work, \
                 the sweeps and cancel_work skip or wait for a locked row, so the frozen \
                 holder's open transaction, not its lease, bounds the item"
            ));
        }
    }
    tokio::time::sleep_until(thaw).await;
    h.fleet.signal(victim, "CONT").await?;
    h.say(&format!("SIGCONT {app}"));
    if let Some(fault) = h.faults.last_mut() {
        fault.until = h.db.now().await.ok();
    }
    zombie_note(h, victim, "SIGCONT", before).await;
    let by = h.finish_by(t.finish_s(span));
    h.wait_finished(by).await;
    Ok(())
}

/// The only worker, behind the proxy, has its connections frozen for stale_after + the lock
/// grace + 2 sweeps (37 s at the defaults, 8 s short; less than dead_after), from just
/// before its heartbeat falls due, then thawed.
/// Nobody else can reap it; it must not reap itself (docs/guarantees.md, finding 3). Its
/// leases, expired meanwhile, are its own to finish or claim back.
pub(crate) async fn partition_alone(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let secs = t.stale_after_s + t.lock_grace_s + 2.0 * t.sweep_s;
    if secs >= t.dead_after_s {
        return Err(format!(
            "partition-alone needs stale_after + lock grace + 2 sweeps ({secs:.0} s) below \
             dead_after ({:.0} s)",
            t.dead_after_s
        )
        .into());
    }
    let proxy = Proxy::start(h.cluster.port()).await?;
    let mut spec = WorkerSpec::new(h.profile, proxy.port(), 2 * CONCURRENCY);
    spec.label = Some(format!("alone, behind the proxy on port {}", proxy.port()));
    h.proxy = Some(proxy);
    h.start_workers(vec![spec]).await?;
    let victim = 0;
    let name = h.fleet.procs[victim].name.clone();
    let feeder = Feeder::start(h, 15.0).await?;
    h.at(2.0).await;
    h.cancel_some(feeder.cancels).await?;
    h.wait_holding(victim, holding_deadline(h)).await;
    // Just before a heartbeat falls due (its age 11/12 of the slow cadence), so that the
    // freeze stalls a beat and the alive-lock check (finding 3's path).
    let due = at_beat_age(
        h,
        youngest,
        t.slow_s * 11.0 / 12.0,
        t.slow_s,
        2.0 * t.slow_s + 10.0,
    )
    .await;

    let before = stopped_handlers_of(h, victim).await;
    let at = h.db.now().await?;
    if let Some(p) = &h.proxy {
        p.set_frozen(true);
    }
    h.fleet.note(victim, Life::Frozen);
    let frozen = Instant::now();
    let (instances, held) = h.leases_of(victim).await?;
    h.mark(&format!(
        "partition: {name}, the only worker, has its connections frozen for {secs:.0} s \
         (stale_after {} s + lock grace {} s + 2 sweeps), holding {} leases, its heartbeat {}",
        t.stale_after_s,
        t.lock_grace_s,
        held.len(),
        due.map_or("not seen due".into(), |a| format!("{a:.1} s old"))
    ));
    tokio::time::sleep_until(frozen + Duration::from_secs_f64(secs)).await;
    if let Some(p) = &h.proxy {
        p.set_frozen(false);
    }
    h.fleet.note(victim, Life::Thawed);
    let thawed = Instant::now();
    let until = h.db.now().await?;
    h.mark(&format!("partition healed: {name}'s held bytes flow again"));
    h.faults.push(Fault {
        label: format!("partition of {name} (alone) {secs:.0} s"),
        at,
        until: Some(until),
        procs: vec![name],
        instances,
        affected: held,
        bound: secs + t.poll_max_s + 2.0,
        bound_why: format!(
            "the {secs:.0} s partition + the longest claim poll wait {} s + 2 s",
            t.poll_max_s
        ),
    });
    zombie_note(h, victim, "the thaw", before).await;
    h.watch_settle(thawed, "the thaw").await;
    feeder.finish(h).await?;
    Ok(())
}

/// The chaos cluster's streaming standby: a cluster of its own beside it, on a port of its
/// own.
const STANDBY: &str = "chaos-standby";

/// A database failover. The chaos cluster gets a streaming standby (`pg_basebackup -R`, its
/// own port on 127.0.0.1) with **synchronous** replication, so that a commit is acknowledged
/// only once the standby has it and the failover loses nothing an application saw committed
/// (with asynchronous replication acknowledged commits can be lost; not tested here). Three
/// workers connect with a multi-host URL — the primary, then the standby,
/// `target_session_attrs=read-write`. When every heartbeat is past stale_after where the
/// cadence allows it (so that only the alive-locks vouch for the instances, and the promoted
/// server's start time, older than the crash, would not excuse an eviction), with work in
/// flight, the primary is stopped with `-m immediate` (a crash) and the standby promoted.
/// The workers must find it through their URL and come back (alive-lock, LISTEN, a
/// completion) within the come-back bound; nobody may be evicted, watched for the settle time
/// after the promotion, and every worker must still run as the instance it started as.
/// Everything the suite read on the old primary just before the crash must be on the new one.
/// From the promotion on, the suite's pool (the feeder's too) is on the promoted server, and
/// the checks read the evidence there; the harness then stops and removes the standby and
/// starts the old primary again for the next scenario.
pub(crate) async fn failover(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let cluster = h.cluster;
    let made = Instant::now();
    let standby =
        tokio::task::block_in_place(|| cluster.start_standby(STANDBY, Replication::Synchronous))?;
    let standby_port = standby.cluster().port();
    h.standby = Some(standby);
    let replication = h.db.replication_of(STANDBY).await?;
    h.say(&format!(
        "streaming standby {STANDBY} on port {standby_port}, made in {:.1} s (pg_basebackup); \
         the primary reports it {}",
        made.elapsed().as_secs_f64(),
        replication
            .as_ref()
            .map_or("not at all".into(), |(state, sync)| format!(
                "{state}, {sync}"
            ))
    ));
    let specs = (0..3)
        .map(|_| {
            let mut spec = h.direct(CONCURRENCY);
            spec.standby = Some(standby_port);
            spec.label = Some(format!(
                "multi-host URL: ports {}, {standby_port}, target_session_attrs=read-write",
                cluster.port()
            ));
            spec
        })
        .collect();
    h.start_workers(specs).await?;
    let feeder = Feeder::start(h, 15.0).await?;
    h.at(2.0).await;
    h.cancel_some(feeder.cancels).await?;

    // Late in the slow cadence: every heartbeat past stale_after where the cadence allows it
    // (at the defaults), so that only the alive-locks keep the instances alive.
    let old = (t.stale_after_s + t.sweep_s).min(0.9 * t.slow_s);
    let age = at_beat_age(h, youngest, old, f64::MAX, t.slow_s + 10.0).await;
    let in_flight = h.wait_running(holding_deadline(h)).await;
    let label = "failover (primary crashed, standby promoted)".to_owned();
    if in_flight == 0 {
        h.violations.push(format!(
            "vacuous: no item was running at the {label}, so it tested nothing"
        ));
    }
    // What the standby must have: the state of replication and every evidence row the suite
    // can see committed on the primary, read last thing before the crash.
    let replication = h.db.replication_of(STANDBY).await?;
    if replication.as_ref().is_none_or(|(_, sync)| sync != "sync") {
        h.violations.push(format!(
            "vacuous: at the {label} the primary did not report {STANDBY} as its synchronous \
             standby ({replication:?}): acknowledged commits could be lost"
        ));
    }
    let seen = h.db.evidence_rows().await?;
    h.mark(&format!(
        "failover: the primary stopped with -m immediate, {in_flight} items running, {}; \
         standby {}",
        age.map_or(format!("not every heartbeat {old:.1} s old yet"), |a| {
            format!("every heartbeat at least {a:.1} s old")
        }),
        replication
            .as_ref()
            .map_or("not streaming".into(), |(state, sync)| format!(
                "{state}, {sync}"
            ))
    ));
    let began = Instant::now();
    tokio::task::block_in_place(|| cluster.stop_with(StopMode::Immediate))?;
    let crashed = began.elapsed().as_secs_f64();
    let promoted = match &h.standby {
        Some(standby) => tokio::task::block_in_place(|| standby.promote()),
        None => return Err("the failover scenario lost its standby".into()),
    };
    promoted?;
    h.db.move_to(standby_port);
    let back = Instant::now();
    let down = began.elapsed().as_secs_f64();
    h.mark(&format!(
        "standby promoted: writable {down:.2} s after the crash (the immediate stop took \
         {crashed:.2} s); the suite reads the promoted server from now on"
    ));
    let what = format!("server down {down:.2} s (crash to promoted standby)");
    comeback(h, label.clone(), &what).await;

    // Nothing acknowledged was lost: the evidence tables only grow.
    match h.db.evidence_rows().await {
        Ok(now) => {
            let names = [
                "item audit",
                "ledger",
                "effects",
                "enqueued ids",
                "instance audit",
            ];
            let missing: Vec<String> = names
                .iter()
                .zip(seen.iter().zip(now.iter()))
                .filter(|(_, (seen, now))| now < seen)
                .map(|(name, (seen, now))| format!("{name} {now} of {seen}"))
                .collect();
            let rows = |counts: &[i64; 5]| {
                names
                    .iter()
                    .zip(counts)
                    .map(|(name, n)| format!("{n} {name}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if missing.is_empty() {
                h.notes.push(format!(
                    "the promoted standby held every evidence row the suite saw on the primary \
                     just before the crash ({}; {} once it was back)",
                    rows(&seen),
                    rows(&now)
                ));
            } else {
                h.violations.push(format!(
                    "the {label} lost acknowledged commits: the promoted standby holds fewer \
                     rows than the primary had before the crash ({})",
                    missing.join(", ")
                ));
            }
        }
        Err(e) => h.violations.push(format!(
            "after the {label}, the promoted server could not be read: {e}"
        )),
    }
    h.watch_settle(back, "the promotion").await;
    // Nobody had to register afresh: each worker still runs as the instance it printed.
    for i in h.fleet.live() {
        let (name, printed) = (h.fleet.procs[i].name.clone(), h.fleet.procs[i].instance);
        let now = h.db.instance_named(&name).await.ok().flatten();
        if now.is_none() || now != printed {
            h.violations.push(format!(
                "after the {label}, {name} runs as instance {} instead of {} (the one it started \
                 as)",
                now.map_or("none".into(), |i| i.to_string()),
                printed.map_or("?".into(), |i| i.to_string())
            ));
        }
    }
    feeder.finish(h).await?;
    match h.db.server().await {
        Ok((port, in_recovery)) if i32::from(standby_port) == port && !in_recovery => {
            h.notes.push(format!(
                "the evidence is read from the promoted standby (port {port}, out of recovery)"
            ));
        }
        Ok((port, in_recovery)) => h.violations.push(format!(
            "the suite reads port {port} (in recovery: {in_recovery}), not the promoted \
             standby's {standby_port}"
        )),
        Err(e) => h.violations.push(format!(
            "the promoted standby could not be read at the end: {e}"
        )),
    }
    Ok(())
}
