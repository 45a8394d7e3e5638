//! The fault scripts. Each starts its workers, enqueues its workload, applies its faults on a
//! timeline (recording what each took away), and waits for the work to finish; the harness
//! then drains, checks and reports.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use workpump_testdb::StopMode;

use super::fleet::{scrape, Life, Profile, WorkerSpec};
use super::harness::{Fault, Harness};
use super::liveness;
use super::proxy::Proxy;
use super::report::Recovery;
use super::store::{HoldBurst, KeySkew, Mix, Sampler};
use super::Result;
use crate::harness::check::{self, Down, Evidence, Killed};
use crate::harness::procs::Metrics;

/// Handlers per worker.
pub(crate) const CONCURRENCY: usize = 16;

pub(crate) async fn run(name: &str, h: &mut Harness<'_>) -> Result<()> {
    match name {
        "sigkill" => kill_loop(h).await,
        "sigstop" => sigstop(h).await,
        "sigstop-alone" => sigstop_alone(h).await,
        "listener-kill" => listener_kill(h).await,
        "pg-restart" => pg_restart(h).await,
        "pg-outage" => liveness::pg_outage(h).await,
        "backend-crash" => liveness::backend_crash(h).await,
        "lock-blip" => liveness::lock_blip(h).await,
        "frozen-tx" => liveness::frozen_tx(h).await,
        "partition-alone" => liveness::partition_alone(h).await,
        "failover" => liveness::failover(h).await,
        "pool-exhaustion" => pool_exhaustion(h).await,
        "partition" => partition(h).await,
        "clock-skew" => clock_skew(h).await,
        "keyed" => keyed(h).await,
        "fleet-limit" => fleet_limit(h).await,
        other => Err(format!("unknown scenario {other}").into()),
    }
}

/// How long the suite waits for a chosen victim to hold a lease before faulting it: a claim
/// poll, a sweep (scheduled items are promoted by it), and 5 s.
pub(crate) fn holding_deadline(h: &Harness<'_>) -> Instant {
    let t = h.timing();
    Instant::now() + Duration::from_secs_f64(t.poll_max_s + t.sweep_s + 5.0)
}

/// SIGKILL a random worker, repeatedly, each time starting a replacement; the last fault is
/// a SIGTERM drain instead (its releases give the attempt back, which the history check
/// accounts for).
async fn kill_loop(h: &mut Harness<'_>) -> Result<()> {
    let (items, spread_ms, faults) = match (h.profile, h.quick) {
        (Profile::Defaults, _) => (3_000, 20_000, 3),
        (Profile::Short, true) => (2_000, 10_000, 3),
        (Profile::Short, false) => (4_000, 16_000, 5),
    };
    let t = h.timing();
    let specs = (0..4).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mix = Mix::new(items, spread_ms);
    h.enqueue(&mix).await?;
    // Scheduled items wait for a sweep to be promoted: start the faults once work runs.
    let first = t.sweep_s + 1.5;
    let gap = (spread_ms as f64 / 1000.0 - first + 2.5) / (faults as f64 + 0.5);
    for k in 0..faults {
        h.at(first + gap * k as f64).await;
        if k == 1 {
            h.cancel_some(mix.cancels).await?;
        }
        let Some(victim) = h.pick(&[]) else { break };
        h.wait_holding(victim, holding_deadline(h)).await;
        let name = h.fleet.procs[victim].name.clone();
        if k + 1 == faults {
            let at = h.db.now().await?;
            let (instances, held) = h.leases_of(victim).await?;
            h.mark(&format!(
                "SIGTERM {name} (a drain), holding {} leases",
                held.len()
            ));
            let deadline = Instant::now() + Duration::from_secs_f64(t.shutdown_s + 15.0);
            if !h.fleet.terminate(victim, deadline).await? {
                h.violations.push(format!(
                    "{name} did not drain within its soft stop and shutdown timeout + 15 s"
                ));
            }
            h.faults.push(Fault {
                label: format!("drain {name}"),
                at,
                until: None,
                procs: vec![name],
                instances,
                affected: held,
                bound: t.shutdown_s + 2.0,
                bound_why: format!(
                    "leases released by the drain: soft stop and shutdown timeout {} s + 2 s",
                    t.shutdown_s
                ),
            });
        } else {
            sigkill(h, victim).await?;
        }
        replace(h).await?;
    }
    let by = h.finish_by(t.finish_s(spread_ms as f64 / 1000.0));
    h.wait_finished(by).await;
    Ok(())
}

/// SIGKILLs `victim` (which the caller saw holding a lease) and records the fault: its
/// leases must run elsewhere within the lock grace and two sweeps.
async fn sigkill(h: &mut Harness<'_>, victim: usize) -> Result<()> {
    sigkill_or_retry(h, victim, false).await.map(|_| ())
}

/// SIGKILLs `victim` and, when it held a lease at the kill or `retry` is false, records the
/// fault as [`sigkill`] does: true. With `retry`, a kill that found no lease (the victim's
/// items, of a few hundred ms, all ended between the pick and the signal) is said and not
/// recorded, so that the caller picks another victim: false.
async fn sigkill_or_retry(h: &mut Harness<'_>, victim: usize, retry: bool) -> Result<bool> {
    let t = h.timing();
    let name = h.fleet.procs[victim].name.clone();
    let at = h.db.now().await?;
    h.fleet.kill(victim).await?;
    let (instances, held) = h.leases_of(victim).await?;
    if held.is_empty() && retry {
        h.mark(&format!(
            "SIGKILL {name}: it held no lease at the kill (its items ended since the pick); \
             another is picked"
        ));
        return Ok(false);
    }
    h.mark(&format!("SIGKILL {name}, holding {} leases", held.len()));
    h.faults.push(Fault {
        label: format!("SIGKILL {name}"),
        at,
        until: None,
        procs: vec![name],
        instances,
        affected: held,
        bound: 2.0 * t.sweep_s + t.lock_grace_s + 3.0,
        bound_why: format!(
            "lock grace {} s + 2 sweeps of {} s + 3 s",
            t.lock_grace_s, t.sweep_s
        ),
    });
    Ok(true)
}

/// Starts a replacement worker and waits until it is ready.
async fn replace(h: &mut Harness<'_>) -> Result<()> {
    let spec = h.direct(CONCURRENCY);
    replace_with(h, spec).await
}

/// Starts a replacement worker of `spec` and waits until it is ready.
async fn replace_with(h: &mut Harness<'_>, spec: WorkerSpec) -> Result<()> {
    let index = h.start_worker(spec).await?;
    let name = h.fleet.procs[index].name.clone();
    h.say(&format!("replacement {name} ready"));
    Ok(())
}

/// Ordering keys under SIGKILL and SIGSTOP. Every item but the designed dead letters carries
/// a key: about a third of them over 8 hot keys (skewed, all due at once: each hot key is a
/// backlog that drains one item at a time through the faults), the rest over a long tail of
/// keys due over the spread. A worker holding heads is SIGSTOPped past its lease, and
/// continued; a worker holding heads is SIGKILLed (and replaced), twice (a full run: three
/// times). At the short settings the pause (lease + 4 s) ends while the tail still runs, so it
/// comes first and the kills follow; at the defaults it outlasts the whole workload (64 s),
/// so the kills come first, while the keys run, and the pause last, on a worker still holding
/// heads (the spread is longer there, so that work is left for it).
/// Then, besides the suite's checks, [`check::keyed`]: per key one claim at a time, a head
/// taken from its process only when that process was killed or stopped past its lease, claims
/// and completions in enqueue order, no outcome under a token once its key moved on. It must
/// have seen keyed items claimed twice, and heads taken over after a kill and after a pause.
async fn keyed(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let (items, spread_ms, kills) = match (h.profile, h.quick) {
        (Profile::Defaults, _) => (1_200, 16_000, 2),
        // Due over 14 s, so that the tail still runs when the kills come after the 7 s pause
        // (over 8 s, the kills at 10.6 s once found no worker holding a lease: vacuous).
        (Profile::Short, true) => (1_000, 14_000, 2),
        (Profile::Short, false) => (1_600, 14_000, 3),
    };
    let specs = (0..4).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mut mix = Mix::new(items, spread_ms);
    mix.sleep_ms = (50, 400);
    mix.keys = Some(KeySkew {
        hot: 8,
        hot_share: 0.35,
        tail: items / 3,
    });
    h.enqueue(&mix).await?;
    let pause = t.lease_s + 4.0;
    // The pause goes where the keys still run: first when it ends within the spread.
    let pause_first = pause * 1000.0 < spread_ms as f64;
    h.at(1.5).await;
    h.cancel_some(mix.cancels).await?;
    for k in 0..kills {
        h.at(h.elapsed().max(1.5) + 1.0).await;
        if k == 0 && pause_first {
            // While the tail keys still run: the paused worker then holds many heads.
            if let Some(victim) = pick_holding(h).await {
                freeze(h, victim, Freeze::Sigstop, pause).await?;
            }
            h.at(h.elapsed() + 1.0).await;
        }
        // The worker holding the most heads; if they all ended before the signal, another
        // (up to three kills for one fault).
        for attempt in 0..3 {
            let Some(victim) = pick_most_holding(h).await else {
                break;
            };
            let hit = sigkill_or_retry(h, victim, attempt < 2).await?;
            replace(h).await?;
            if hit {
                break;
            }
        }
    }
    if !pause_first {
        h.at(h.elapsed() + 1.0).await;
        if let Some(victim) = pick_holding(h).await {
            freeze(h, victim, Freeze::Sigstop, pause).await?;
        }
    }
    let by = h.finish_by(t.finish_s(spread_ms as f64 / 1000.0) + pause);
    h.wait_finished(by).await;
    check_keys(h).await
}

/// The fleet-wide running limit of the `fleet-limit` scenario's queue.
const FLEET_LIMIT: u32 = 5;

/// Handlers per worker in the `fleet-limit` scenario: four workers of 4 (16 handlers, over
/// three times the limit), so that the limit, not the workers, bounds the running count —
/// also after a kill, when three workers (12 handlers) remain until the replacement is ready
/// — and so that the count would visibly overshoot (up to 16) if the store did not hold it.
const FLEET_CONCURRENCY: usize = 4;

/// A worker of the `fleet-limit` scenario: [`FLEET_CONCURRENCY`] handlers, and its queue
/// declared with the same `max_running` the suite set (`[queues.chaos] max_running`).
fn limited_worker(h: &Harness<'_>) -> WorkerSpec {
    let mut spec = h.direct(FLEET_CONCURRENCY);
    spec.env.extend(crate::harness::worker_env(&[(
        "queues.chaos.max_running",
        FLEET_LIMIT,
    )]));
    spec.label = Some(format!(
        "{FLEET_CONCURRENCY} handlers, queue max_running {FLEET_LIMIT}"
    ));
    spec
}

/// A fleet-wide running limit under SIGKILL. The queue gets `max_running` =
/// [`FLEET_LIMIT`] (set by the suite as an operator would, and declared alike by the
/// workers); four workers of [`FLEET_CONCURRENCY`] handlers share a workload due at once,
/// with sleepers of 1–3 s, so that a backlog waits behind the limit for the whole timeline.
/// The worker holding the most leases is SIGKILLed every kill bound + 1 s (3 times; a full
/// run 5), and replaced. Its items stay `running` in the store, holding their slots, until their
/// leases are reclaimed. Besides the suite's checks, [`check::fleet_limit`] on the audit:
/// never more than the limit running at any instant, and after each kill the limit's slots
/// filled by live processes again within the kill's bound while items wait; vacuous unless
/// the count reached the limit and each kill found items running under its process. A
/// sampler of the running count, every 50 ms, must never see more than the limit either.
async fn fleet_limit(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let (items, kills) = if h.quick { (480, 3) } else { (700, 5) };
    h.db.set_max_running(FLEET_LIMIT).await?;
    let specs = (0..4).map(|_| limited_worker(h)).collect();
    h.start_workers(specs).await?;
    let sampler = Sampler::start(&h.db);
    let mut mix = Mix::new(items, 1_000);
    mix.sleep_ms = (1_000, 3_000);
    h.enqueue(&mix).await?;
    h.say(&format!(
        "queue max_running {FLEET_LIMIT}; {} handlers in all",
        4 * FLEET_CONCURRENCY
    ));
    // A kill's slots must be back within its bound (that of `sigkill`): the next kill comes
    // after it, so that each kill's recovery is measured on its own.
    let gap = 2.0 * t.sweep_s + t.lock_grace_s + 3.0 + 1.0;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    for k in 0..kills {
        h.at(3.0 + gap * k as f64).await;
        let Some(victim) = pick_most_holding(h).await else {
            break;
        };
        sigkill(h, victim).await?;
        let spec = limited_worker(h);
        replace_with(h, spec).await?;
    }
    let by = h.finish_by(t.finish_s(h.elapsed()));
    h.wait_finished(by).await;
    let sampled = sampler.stop().await?;
    check_fleet_limit(h, sampled).await
}

/// The live, running worker that holds the most leases now (with only 5 slots a worker
/// may hold a single no-op, which could end before the signal lands, making the kill
/// vacuous); else as [`pick_holding`].
async fn pick_most_holding(h: &mut Harness<'_>) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for i in h.fleet.live() {
        if h.fleet.procs[i].stopped {
            continue;
        }
        let held = h.leases_of(i).await.map_or(0, |(_, held)| held.len());
        if held > best.map_or(0, |(_, n)| n) {
            best = Some((i, held));
        }
    }
    match best {
        Some((i, _)) => Some(i),
        None => pick_holding(h).await,
    }
}

/// [`check::fleet_limit`] on the scenario's evidence, with its kills, and the sampler's
/// figures (`samples`, the most running in one).
async fn check_fleet_limit(h: &mut Harness<'_>, (samples, most): (usize, i64)) -> Result<()> {
    let ev = Evidence::load(&h.db.pool).await?;
    let killed: Vec<Killed> = h
        .faults
        .iter()
        .flat_map(|f| {
            f.procs.iter().map(|p| Killed {
                proc: p.clone(),
                at: f.at,
                bound: f.bound,
            })
        })
        .collect();
    let limit = i64::from(FLEET_LIMIT);
    let f = check::fleet_limit(&ev, limit, &killed, h.t0);
    let back: Vec<String> = f
        .kills
        .iter()
        .map(|k| {
            format!(
                "{} (held {}) {}{}",
                k.proc,
                k.held,
                k.after
                    .map_or("never".to_owned(), |a| format!("after {a:.1} s")),
                if k.backlog {
                    ""
                } else {
                    " (no backlog throughout)"
                }
            )
        })
        .collect();
    h.notes.push(format!(
        "fleet limit {limit}: at most {} running by the audit (first at {}), at most {most} in \
         {samples} samples of the store; at the limit {:.0} % of the {:.1} s in which items \
         waited; the slots of each killed worker filled by live workers again: {}",
        f.peak,
        f.peak_at
            .map_or("-".to_owned(), |at| format!("{:+.2} s", at - h.t0)),
        100.0 * f.at_limit_s / f.backlog_s.max(f64::MIN_POSITIVE),
        f.backlog_s,
        back.join(", ")
    ));
    if most > limit {
        h.violations.push(format!(
            "the sampler saw {most} items running at once, over the limit of {limit}"
        ));
    }
    if samples == 0 {
        h.violations
            .push("vacuous: the sampler never read the running count".into());
    }
    h.violations.extend(f.violations);
    Ok(())
}

/// A random live, running worker that holds a lease now, waiting for one (see
/// [`holding_deadline`]); else any live worker, once it holds one (or the wait ran out).
async fn pick_holding(h: &mut Harness<'_>) -> Option<usize> {
    let deadline = holding_deadline(h);
    while Instant::now() < deadline {
        let mut holding = Vec::new();
        for i in h.fleet.live() {
            if h.fleet.procs[i].stopped {
                continue;
            }
            if h.leases_of(i).await.is_ok_and(|(_, held)| !held.is_empty()) {
                holding.push(i);
            }
        }
        if !holding.is_empty() {
            return Some(holding[h.rng.below(holding.len())]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.pick(&[])
}

/// [`check::keyed`] on the scenario's evidence, with the processes its faults took down.
async fn check_keys(h: &mut Harness<'_>) -> Result<()> {
    let ev = Evidence::load(&h.db.pool).await?;
    let keys: HashMap<i64, (String, i64)> = sqlx::query_as::<_, (i64, String, i64)>(
        "SELECT id, ordering_key, ordering_seq FROM workpump.work_all WHERE ordering_key IS NOT NULL",
    )
    .fetch_all(&h.db.pool)
    .await?
    .into_iter()
    .map(|(id, key, seq)| (id, (key, seq)))
    .collect();
    let down: Vec<Down> = h
        .faults
        .iter()
        .flat_map(|f| {
            f.procs.iter().map(|p| Down {
                proc: p.clone(),
                at: f.at,
                until: f.until,
            })
        })
        .collect();
    let k = check::keyed(&ev, &keys, &down);
    let distinct: std::collections::HashSet<&str> =
        keys.values().map(|(key, _)| key.as_str()).collect();
    h.notes.push(format!(
        "ordering keys: {} keyed items over {} keys, {} claims, {} items claimed more than \
         once, {} heads taken over after a SIGKILL and {} after a SIGSTOP past the lease, {} \
         handovers of a key between processes",
        keys.len(),
        distinct.len(),
        k.claims,
        k.claimed_twice,
        k.after_kill,
        k.after_stop,
        k.handovers
    ));
    for (count, what) in [
        (k.claims, "no keyed item was claimed"),
        (k.claimed_twice, "no keyed item was claimed twice"),
        (k.after_kill, "no kill took a running head from its process"),
        (
            k.after_stop,
            "no pause let a running head's lease expire into a peer's claim",
        ),
        (k.handovers, "no key moved from one process to another"),
    ] {
        if count == 0 {
            h.violations.push(format!("vacuous: {what}"));
        }
    }
    h.violations.extend(k.violations);
    Ok(())
}

/// SIGSTOP a worker past its lease, then SIGCONT. In a full run with a dead_after of a
/// minute or less (the short profile), a second pause outlasts `dead_after` too, so the
/// paused instance is reaped and comes back evicted.
async fn sigstop(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    // Past the lease; and (full run) past dead_after, so the paused instance is reaped.
    let second = t.lease_s + 9.0;
    let (items, spread_ms, pauses) = if h.quick || t.dead_after_s > 60.0 {
        (2_000, 12_000, vec![(3.0, t.lease_s + 4.0)])
    } else {
        (
            4_000,
            22_000,
            vec![(3.0, t.lease_s + 4.0), (second, t.dead_after_s + 4.0)],
        )
    };
    let paused: f64 = pauses.iter().map(|(_, p)| p).sum();
    let specs = (0..4).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mix = Mix::new(items, spread_ms);
    h.enqueue(&mix).await?;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    for (start, pause) in pauses {
        h.at(start).await;
        let Some(victim) = h.pick(&[]) else { break };
        freeze(h, victim, Freeze::Sigstop, pause).await?;
    }
    let by = h.finish_by(t.finish_s(spread_ms as f64 / 1000.0) + paused);
    h.wait_finished(by).await;
    Ok(())
}

/// SIGSTOP the only worker past its lease — a VM pause on a one-instance deployment, or on
/// a quiet fleet whose peers are not polling — then SIGCONT. No peer sweeps or reclaims
/// meanwhile, so when it resumes every handler in flight finds its lease fence fired while the
/// store still holds its lease (expired, not yet released): whatever it records before its own
/// sweep releases the lapsed leases lands, the rest runs again. The work must still end as
/// designed.
async fn sigstop_alone(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let specs = vec![h.direct(2 * CONCURRENCY)];
    h.start_workers(specs).await?;
    let mut mix = Mix::new(2_000, 8_000);
    mix.cancels = 5;
    h.enqueue(&mix).await?;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    h.at(3.0).await;
    let victim = 0;
    h.wait_holding(victim, holding_deadline(h)).await;
    // Past the lease, so that every handler's lease fence fires while it is stopped.
    let pause = t.lease_s + 3.0;
    let name = h.fleet.procs[victim].name.clone();
    let before = stopped_handlers_of(h, victim).await;
    let at = h.db.now().await?;
    h.fleet.signal(victim, "STOP").await?;
    let stopped = Instant::now();
    let (instances, held) = h.leases_of(victim).await?;
    h.mark(&format!(
        "SIGSTOP {name}, the only worker, for {pause:.0} s, holding {} leases",
        held.len()
    ));
    tokio::time::sleep_until(stopped + Duration::from_secs_f64(pause)).await;
    h.fleet.signal(victim, "CONT").await?;
    let until = h.db.now().await?;
    h.say(&format!("SIGCONT {name}"));
    h.faults.push(Fault {
        label: format!("SIGSTOP {name} (alone) {pause:.0} s"),
        at,
        until: Some(until),
        procs: vec![name],
        instances,
        affected: held,
        bound: pause + t.poll_max_s + 2.0,
        bound_why: format!(
            "the {pause:.0} s pause (lease + 3 s) + the longest claim poll wait {} s + 2 s",
            t.poll_max_s
        ),
    });
    zombie_note(h, victim, "SIGCONT", before).await;
    let by = h.finish_by(t.finish_s(8.0) + pause);
    h.wait_finished(by).await;
    Ok(())
}

/// How a worker is frozen: its process stopped, or its connections stalled by the proxy.
#[derive(Clone, Copy)]
enum Freeze {
    Sigstop,
    Partition,
}

/// Freezes `victim` for `secs` (once it holds a lease), then thaws it, and records the
/// fault: its leases must be running elsewhere (or ended) within the lease plus the longest
/// claim poll wait, as nothing but the lease can tell a frozen process from a slow one.
async fn freeze(h: &mut Harness<'_>, victim: usize, how: Freeze, secs: f64) -> Result<()> {
    let t = h.timing();
    h.wait_holding(victim, holding_deadline(h)).await;
    let name = h.fleet.procs[victim].name.clone();
    let before = stopped_handlers_of(h, victim).await;
    let at = h.db.now().await?;
    match how {
        Freeze::Sigstop => h.fleet.signal(victim, "STOP").await?,
        Freeze::Partition => {
            if let Some(p) = &h.proxy {
                p.set_frozen(true);
            }
            h.fleet.note(victim, Life::Frozen);
        }
    }
    let frozen = Instant::now();
    let (instances, held) = h.leases_of(victim).await?;
    let held_n = held.len();
    h.mark(&match how {
        Freeze::Sigstop => format!("SIGSTOP {name} for {secs:.0} s, holding {held_n} leases"),
        Freeze::Partition => format!(
            "partition: {name}'s connections frozen for {secs:.0} s, holding {held_n} leases"
        ),
    });
    tokio::time::sleep_until(frozen + Duration::from_secs_f64(secs)).await;
    match how {
        Freeze::Sigstop => h.fleet.signal(victim, "CONT").await?,
        Freeze::Partition => {
            if let Some(p) = &h.proxy {
                p.set_frozen(false);
            }
            h.fleet.note(victim, Life::Thawed);
        }
    }
    let until = h.db.now().await?;
    let (label, thawed, after) = match how {
        Freeze::Sigstop => ("SIGSTOP", format!("SIGCONT {name}"), "SIGCONT"),
        Freeze::Partition => (
            "partition",
            format!("partition healed: {name}'s held bytes flow again"),
            "the thaw",
        ),
    };
    h.say(&thawed);
    let (bound, bound_why) = t.lapsed_lease_bound();
    h.faults.push(Fault {
        label: format!("{label} {name} {secs:.0} s"),
        at,
        until: Some(until),
        procs: vec![name],
        instances,
        affected: held,
        bound,
        bound_why,
    });
    zombie_note(h, victim, after, before).await;
    Ok(())
}

/// Handlers of a worker that its lease fence, a lost lease or an eviction stopped, so far.
pub(crate) async fn stopped_handlers_of(h: &Harness<'_>, index: usize) -> f64 {
    scrape(h.fleet.procs[index].metrics)
        .await
        .map_or(0.0, |m| stopped_handlers(&m))
}

fn stopped_handlers(m: &Metrics) -> f64 {
    ["lease_fence", "lease_lost", "evicted"]
        .iter()
        .map(|r| {
            m.sum(
                "workpump_handler_cancellations_total",
                &[&format!("reason=\"{r}\"")],
            )
        })
        .sum()
}

/// Once a paused or partitioned worker came back and more of its handlers stopped than
/// `before` the fault (fence, lost lease or eviction), or 3 s after: what its own metrics say
/// about its handlers and its late writes.
pub(crate) async fn zombie_note(h: &mut Harness<'_>, index: usize, after: &str, before: f64) {
    let back = Instant::now();
    let proc = &h.fleet.procs[index];
    let scraped = loop {
        let scraped = scrape(proc.metrics).await;
        let stopped = scraped.as_ref().is_ok_and(|m| stopped_handlers(m) > before);
        if stopped || back.elapsed() >= Duration::from_secs(3) {
            break scraped;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waited = back.elapsed().as_secs_f64();
    let note = match scraped {
        Ok(m) => format!(
            "{} {waited:.1} s after {after}: lease fence fired {} times, handlers cancelled for \
             a lost lease {} / fence {} / eviction {}, outcome writes fenced out {}, evictions \
             it noticed (log) {}",
            proc.name,
            m.sum("workpump_lease_fence_fired_total", &[]),
            m.sum(
                "workpump_handler_cancellations_total",
                &["reason=\"lease_lost\""]
            ),
            m.sum(
                "workpump_handler_cancellations_total",
                &["reason=\"lease_fence\""]
            ),
            m.sum(
                "workpump_handler_cancellations_total",
                &["reason=\"evicted\""]
            ),
            m.sum("workpump_items_total", &["outcome=\"fenced_out\""]),
            std::fs::read_to_string(&proc.log)
                .map(|log| log.matches("instance evicted").count())
                .unwrap_or(0),
        ),
        Err(e) => format!("{}: no metrics after {after}: {e}", proc.name),
    };
    h.notes.push(note);
}

/// Terminate every LISTEN session, repeatedly: claimers poll meanwhile and reconnect.
async fn listener_kill(h: &mut Harness<'_>) -> Result<()> {
    h.no_lapse = true;
    let (items, spread_ms, kills): (usize, u64, &[f64]) = if h.quick {
        (2_000, 10_000, &[2.5, 6.0])
    } else {
        (3_000, 14_000, &[2.5, 6.0, 9.5])
    };
    let specs = (0..3).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mix = Mix::new(items, spread_ms);
    h.enqueue(&mix).await?;
    for (k, &when) in kills.iter().enumerate() {
        h.at(when).await;
        if k == 1 {
            h.cancel_some(mix.cancels).await?;
        }
        let live = h.fleet.live().len() as i64;
        let at = h.db.now().await?;
        let killed = h.db.kill_listeners().await?;
        let local = Instant::now();
        h.mark(&format!("pg_terminate_backend on {killed} LISTEN sessions"));
        if killed == 0 {
            h.violations.push(format!(
                "vacuous: LISTEN kill #{} found no LISTEN session to terminate",
                k + 1
            ));
        }
        let deadline = local + Duration::from_secs(30);
        let mut back = None;
        while Instant::now() < deadline {
            if let Ok((_, listening)) = h.db.sessions().await {
                if listening >= live {
                    back = Some(local.elapsed().as_secs_f64());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Work goes on meanwhile: some item completes within 3 s of the kill.
        let window = local + Duration::from_secs(3);
        let first_completion = loop {
            if h.db.completed_since(at).await? > 0 {
                break Some(local.elapsed().as_secs_f64());
            }
            if Instant::now() >= window {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if first_completion.is_none() {
            h.violations.push(format!(
                "no item completed in the 3 s after LISTEN kill #{}",
                k + 1
            ));
        }
        if killed < live {
            h.notes.push(format!(
                "LISTEN kill #{}: found {killed} LISTEN sessions for {live} workers",
                k + 1
            ));
        }
        h.recovery.push(Recovery {
            label: format!("LISTEN kill #{}", k + 1),
            seconds: back,
            bound: 5.0,
            bound_why: "the listener reconnects at once (poll base 250 ms meanwhile); 5 s".into(),
            detail: format!(
                "{killed} sessions terminated; every worker listening again after {}; the first \
                 item completed {} after the kill",
                back.map(|s| format!("{s:.2} s"))
                    .unwrap_or_else(|| "never (30 s)".into()),
                first_completion
                    .map(|s| format!("{s:.2} s"))
                    .unwrap_or_else(|| "never (3 s)".into())
            ),
        });
        if back.is_none() {
            h.violations.push(format!(
                "LISTEN kill #{}: the workers did not all listen again within 30 s",
                k + 1
            ));
        }
    }
    let by = h.finish_by(h.timing().finish_s(spread_ms as f64 / 1000.0));
    h.wait_finished(by).await;
    // The claimers' side: each fell back to polling (the NOTIFY gate went unavailable) and
    // came back (healthy again), and is healthy now.
    for i in h.fleet.live() {
        let proc = &h.fleet.procs[i];
        match scrape(proc.metrics).await {
            Ok(m) => {
                let healthy = m.sum("workpump_notify_gate_healthy", &[]);
                h.notes.push(format!(
                    "{}: NOTIFY gate went unavailable {} times and healthy {} times (start \
                     included); catch-up polls on reconnect {}; gate healthy at the end: {}",
                    proc.name,
                    m.sum(
                        "workpump_notify_gate_transitions_total",
                        &["to=\"unavailable\""]
                    ),
                    m.sum(
                        "workpump_notify_gate_transitions_total",
                        &["to=\"healthy\""]
                    ),
                    m.sum("workpump_wake_signals_total", &["source=\"reconnect\""]),
                    healthy == 1.0
                ));
                if healthy != 1.0 {
                    h.violations.push(format!(
                        "{}: its NOTIFY gate is not healthy at the end",
                        proc.name
                    ));
                }
            }
            Err(e) => h.notes.push(format!("{}: no metrics: {e}", proc.name)),
        }
    }
    Ok(())
}

/// Restart PostgreSQL mid-run: a fast restart, then an outage (fast stop, 5 s down — longer
/// than the lease, so every handler's lease fence fires while nobody can reach the store),
/// and in a full run an immediate stop (a crash, with recovery at start). Workers must
/// reconnect, re-take their alive-locks, listen again and finish; nobody may be evicted.
async fn pg_restart(h: &mut Harness<'_>) -> Result<()> {
    let (items, spread_ms, restarts): (usize, u64, &[(f64, StopMode, f64)]) = if h.quick {
        (
            2_000,
            10_000,
            &[(3.0, StopMode::Fast, 0.0), (7.0, StopMode::Fast, 5.0)],
        )
    } else {
        (
            3_000,
            20_000,
            &[
                (3.0, StopMode::Fast, 0.0),
                (7.0, StopMode::Fast, 5.0),
                (16.0, StopMode::Immediate, 0.0),
            ],
        )
    };
    let specs = (0..3).map(|_| h.direct(CONCURRENCY)).collect();
    h.start_workers(specs).await?;
    let mix = Mix::new(items, spread_ms);
    // Work keeps coming if the restarts outlast the spread by more than a come-back bound
    // (with the defaults, waiting for the workers to come back can).
    let comeback = h.timing().comeback_s();
    let feeder = liveness::Feeder::after(h, &mix, comeback, 15.0).await?;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    for &(when, mode, down_s) in restarts {
        h.at(when).await;
        let in_flight = h.wait_running(holding_deadline(h)).await;
        let began = Instant::now();
        let cluster = h.cluster;
        let label = if down_s > 0.0 {
            h.mark(&format!(
                "stopping PostgreSQL ({mode}) for {down_s:.0} s, {in_flight} items running"
            ));
            tokio::task::block_in_place(|| cluster.stop())?;
            tokio::time::sleep(Duration::from_secs_f64(down_s)).await;
            tokio::task::block_in_place(|| cluster.start())?;
            format!("outage ({mode} stop, {down_s:.0} s down)")
        } else {
            h.mark(&format!(
                "restarting PostgreSQL ({mode}), {in_flight} items running"
            ));
            tokio::task::block_in_place(|| cluster.restart(mode))?;
            format!("restart ({mode})")
        };
        if in_flight == 0 {
            h.violations.push(format!(
                "vacuous: no item was running at the {label}, so it tested nothing"
            ));
        }
        let down = began.elapsed().as_secs_f64();
        liveness::comeback(h, label, &format!("server down {down:.2} s")).await;
    }
    feeder.stop(h).await?;
    let by = h.finish_by(
        h.timing()
            .finish_s(h.elapsed().max(spread_ms as f64 / 1000.0)),
    );
    h.wait_finished(by).await;
    Ok(())
}

/// Handlers that sit on pool connections in open transactions, more of them than the pool
/// has connections: renewals, heartbeats and outcomes compete for what is left.
async fn pool_exhaustion(h: &mut Harness<'_>) -> Result<()> {
    h.no_lapse = true;
    let specs = (0..3)
        .map(|_| {
            let mut spec = h.direct(CONCURRENCY);
            spec.env
                .extend(crate::harness::worker_env(&[("max_connections", 4)]));
            spec.label = Some("pool of 4 connections, 16 handlers".into());
            spec
        })
        .collect();
    h.start_workers(specs).await?;
    let mut mix = Mix::new(3_000, 15_000);
    mix.hold = Some(HoldBurst {
        count: 90,
        ms: (2_000, 4_000),
        window_ms: (3_000, 5_000),
    });
    h.enqueue(&mix).await?;
    h.say(
        "each worker: 16 handlers on a pool of 4; 90 items due at +3-5 s hold a connection \
         in an open transaction for 2-4 s each, ignoring cancellation",
    );
    h.at(4.0).await;
    h.cancel_some(mix.cancels).await?;
    let by = h.finish_by(h.timing().finish_s(15.0));
    h.wait_finished(by).await;
    for i in h.fleet.live() {
        let proc = &h.fleet.procs[i];
        let note = match scrape(proc.metrics).await {
            Ok(m) => format!(
                "{}: heartbeats failed {} of {}, renewal calls abandoned {}, `lost` renewal \
                 replies {} (a renewal racing its item's own outcome), lease fence fired {}, \
                 handlers cancelled lease_lost {} / lease_fence {}, outcome writes fenced out {}",
                proc.name,
                m.sum("workpump_heartbeats_total", &["result=\"failed\""]),
                m.sum("workpump_heartbeats_total", &[]),
                m.sum("workpump_lease_renewal_abandoned_calls_total", &[]),
                m.sum("workpump_lease_renewals_total", &["lost"]),
                m.sum("workpump_lease_fence_fired_total", &[]),
                m.sum(
                    "workpump_handler_cancellations_total",
                    &["reason=\"lease_lost\""]
                ),
                m.sum(
                    "workpump_handler_cancellations_total",
                    &["reason=\"lease_fence\""]
                ),
                m.sum("workpump_items_total", &["outcome=\"fenced_out\""]),
            ),
            Err(e) => format!("{}: no metrics: {e}", proc.name),
        };
        h.notes.push(note);
    }
    Ok(())
}

/// A worker behind a TCP proxy is frozen (connections stalled, not closed) past its lease,
/// then thawed; in a full run a second freeze outlasts `dead_after` as well.
async fn partition(h: &mut Harness<'_>) -> Result<()> {
    let t = h.timing();
    let proxy = Proxy::start(h.cluster.port()).await?;
    let mut specs: Vec<WorkerSpec> = (0..3).map(|_| h.direct(CONCURRENCY)).collect();
    let mut behind = WorkerSpec::new(h.profile, proxy.port(), CONCURRENCY);
    behind.label = Some(format!("behind the proxy on port {}", proxy.port()));
    specs.push(behind);
    h.proxy = Some(proxy);
    h.start_workers(specs).await?;
    let victim = h.fleet.procs.len() - 1;
    let mix = Mix::new(3_000, 22_000);
    h.enqueue(&mix).await?;
    h.at(2.0).await;
    h.cancel_some(mix.cancels).await?;
    // Past the lease; then (with a dead_after of a minute or less) past dead_after too, so
    // the frozen instance is reaped.
    let mut freezes = vec![(3.0, t.lease_s + 5.0)];
    if t.dead_after_s <= 60.0 {
        freezes.push((t.lease_s + 11.0, t.dead_after_s + 4.0));
    }
    let frozen: f64 = freezes.iter().map(|(_, s)| s).sum();
    for (start, secs) in freezes {
        h.at(start).await;
        freeze(h, victim, Freeze::Partition, secs).await?;
    }
    let by = h.finish_by(t.finish_s(22.0) + frozen);
    h.wait_finished(by).await;
    Ok(())
}

/// Two workers whose process clock runs an hour ahead (libfaketime): one with an honest
/// monotonic clock, one with the monotonic clock shifted too. Only the database clock
/// decides, so nothing may change: no lease lapses, nobody is reaped, every item ends once.
async fn clock_skew(h: &mut Harness<'_>) -> Result<()> {
    h.no_lapse = true;
    let lib = match faketime_library().await {
        Ok(lib) => lib,
        Err(why) => {
            h.skipped = Some(format!("clock-skew needs libfaketime: {why}"));
            return Ok(());
        }
    };
    let offset = match skew_of_date(&lib).await {
        Ok(offset) if (offset - 3600.0).abs() < 60.0 => offset,
        Ok(offset) => {
            h.skipped = Some(format!(
                "libfaketime ({}) loads, but shifts `date` by {offset:.0} s instead of +3600 s",
                lib
            ));
            return Ok(());
        }
        Err(e) => {
            h.skipped = Some(format!("libfaketime ({lib}) does not work here: {e}"));
            return Ok(());
        }
    };
    h.notes.push(format!(
        "libfaketime {lib}: `date` under it reads {offset:+.0} s"
    ));
    let mut specs: Vec<WorkerSpec> = (0..2).map(|_| h.direct(CONCURRENCY)).collect();
    for honest_monotonic in [true, false] {
        let mut spec = h.direct(CONCURRENCY);
        spec.env.push(("LD_PRELOAD".into(), lib.clone()));
        spec.env.push(("FAKETIME".into(), "+1h".into()));
        if honest_monotonic {
            spec.env.push(("DONT_FAKE_MONOTONIC".into(), "1".into()));
        }
        spec.label = Some(format!(
            "clock +1h, monotonic {}",
            if honest_monotonic {
                "honest"
            } else {
                "faked too"
            }
        ));
        specs.push(spec);
    }
    h.start_workers(specs).await?;
    let mix = Mix::new(3_000, 12_000);
    h.enqueue(&mix).await?;
    h.at(4.0).await;
    h.cancel_some(mix.cancels).await?;
    let by = h.finish_by(h.timing().finish_s(12.0));
    h.wait_finished(by).await;

    let per_proc: Vec<(String, i64)> =
        sqlx::query_as("SELECT proc, count(*) FROM workpump_ledger GROUP BY proc ORDER BY proc")
            .fetch_all(&h.db.pool)
            .await?;
    for proc in &h.fleet.procs {
        let Some(label) = &proc.label else { continue };
        let ran = per_proc
            .iter()
            .find(|(p, _)| *p == proc.name)
            .map_or(0, |(_, n)| *n);
        let measured = log_clock_offset(&proc.log, proc.spawned_at)
            .map(|s| format!("{s:+.0} s"))
            .unwrap_or_else(|| "unreadable".into());
        h.notes.push(format!(
            "{} ({label}): {ran} executions; its log's clock reads {measured} against the suite's",
            proc.name
        ));
        if ran == 0 {
            h.violations
                .push(format!("{} ({label}) executed nothing", proc.name));
        }
    }
    Ok(())
}

/// The preloadable libfaketime, installed with apt-get when missing.
async fn faketime_library() -> Result<String, String> {
    const PATHS: [&str; 3] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    let found = || PATHS.iter().find(|p| std::path::Path::new(p).is_file());
    if let Some(p) = found() {
        return Ok((*p).to_owned());
    }
    println!(
        "   libfaketime is missing; installing Debian's package (apt-get install libfaketime)"
    );
    let install = || async {
        tokio::time::timeout(
            Duration::from_secs(300),
            tokio::process::Command::new("apt-get")
                .args(["install", "-y", "-q", "libfaketime"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status(),
        )
        .await
    };
    let first = install().await;
    if found().is_none() {
        // The package lists may be missing or stale.
        let _ = tokio::time::timeout(
            Duration::from_secs(300),
            tokio::process::Command::new("apt-get")
                .args(["update", "-q"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status(),
        )
        .await;
        let _ = install().await;
    }
    match found() {
        Some(p) => Ok((*p).to_owned()),
        None => Err(format!(
            "not installed, and `apt-get install libfaketime` did not install it ({})",
            match first {
                Ok(Ok(s)) => s.to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".into(),
            }
        )),
    }
}

/// What `date +%s` reads under libfaketime `+1h`, minus the real time.
async fn skew_of_date(lib: &str) -> Result<f64> {
    let out = tokio::process::Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", "+1h")
        .output()
        .await?;
    let faked: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(faked - unix_now())
}

pub(crate) use crate::harness::unix_now;

/// The first timestamp in a worker's log (tracing writes RFC 3339 UTC) minus the suite's
/// clock when it started that worker: the worker logs within a second of its start, so this
/// is its process clock's offset, give or take that second.
fn log_clock_offset(path: &std::path::Path, spawned_at: f64) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let stamp = text.lines().find_map(|line| {
        let clean = strip_ansi(line);
        let token = clean.split_whitespace().next()?.to_owned();
        parse_rfc3339(&token)
    })?;
    Some(stamp - spawned_at)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` as seconds since the epoch.
fn parse_rfc3339(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let ss: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3_600 + mm * 60) as f64 + ss)
}
