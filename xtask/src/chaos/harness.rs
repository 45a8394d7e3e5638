//! What every scenario shares: a fresh database, the fleet, the workload, the timeline of
//! faults, the wait for the end, the drain, the checks and the report.

use std::path::Path;
use std::time::Duration;

use sqlx::types::Uuid;
use tokio::time::Instant;
use workpump_testdb::{Cluster, Standby};

use super::fleet::{self, Fleet, Life, Profile, WorkerSpec};
use super::proxy::Proxy;
use super::report::{Recovery, Report};
use super::store::{self, Db, Mix};
use super::{scenarios, Options, Result, Rng};
use crate::harness::check::{self, Evidence, Lifeline};

/// The longest any scenario may take, start to finish (a backstop: each has its own).
const SCENARIO_CAP: Duration = Duration::from_secs(15 * 60);

/// A fault that took leases away, measured at the end from the audit.
pub(crate) struct Fault {
    pub(crate) label: String,
    /// Database seconds.
    pub(crate) at: f64,
    /// When a pause or partition ended (database seconds); a reaping after that is not
    /// this fault's.
    pub(crate) until: Option<f64>,
    /// The processes it hit (their later writes are "own").
    pub(crate) procs: Vec<String>,
    pub(crate) instances: Vec<Uuid>,
    /// The leases they held: (item, claim token).
    pub(crate) affected: Vec<(i64, i64)>,
    /// The recovery bound, seconds.
    pub(crate) bound: f64,
    /// Why that bound.
    pub(crate) bound_why: String,
}

impl Fault {
    /// Why the fault proves nothing, when it took no lease away: the scenario's checks would
    /// pass whatever the code does.
    pub(crate) fn vacuous(&self) -> Option<String> {
        self.affected.is_empty().then(|| {
            format!(
                "vacuous: {} hit no lease (its process held none at the fault), so it tested \
                 nothing",
                self.label
            )
        })
    }
}

pub(crate) struct Harness<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) db: Db,
    pub(crate) fleet: Fleet,
    pub(crate) rng: Rng,
    pub(crate) quick: bool,
    /// The settings the workers run with, and the figures derived from them.
    pub(crate) profile: Profile,
    pub(crate) t: fleet::Timing,
    /// The database clock at a local instant: how the suite's local times (signals sent,
    /// processes exited) are put on the database's clock.
    pub(crate) clock: (f64, Instant),
    /// The faults as they happened (database seconds, label): evictions are reported
    /// against the latest one before them.
    pub(crate) marks: Vec<(f64, String)>,
    /// Database seconds when the workload was enqueued: the origin of the timeline.
    pub(crate) t0: f64,
    /// Local time of the same moment.
    pub(crate) started: Instant,
    /// When the scenario must be over.
    pub(crate) deadline: Instant,
    pub(crate) items: usize,
    pub(crate) faults: Vec<Fault>,
    pub(crate) recovery: Vec<Recovery>,
    pub(crate) notes: Vec<String>,
    pub(crate) violations: Vec<String>,
    pub(crate) skipped: Option<String>,
    /// No lease may lapse while its owner is registered (no fault takes leases away).
    pub(crate) no_lapse: bool,
    /// Kept until the workers behind it drained.
    pub(crate) proxy: Option<Proxy>,
    /// The chaos cluster's streaming standby (the failover scenario). After a failover it is
    /// the server the evidence is read from; the harness then stops and removes it and starts
    /// the old primary again, on every path ([`restore_primary`]).
    pub(crate) standby: Option<Standby<'a>>,
}

pub(crate) async fn run_scenario(
    name: &'static str,
    profile: Profile,
    cluster: &Cluster,
    exe: &Path,
    logs: &Path,
    seed: u64,
    options: &Options,
) -> Report {
    let began = Instant::now();
    let mut report = Report::new(name, profile.label(), seed);
    println!("── {name}, {} settings (seed {seed})", profile.label());
    let t = match profile.timing() {
        Ok(t) => t,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let logs = logs.join(format!("{name}-{}", profile.label()));
    if let Err(e) = std::fs::create_dir_all(&logs) {
        report.error = Some(format!("creating {}: {e}", logs.display()));
        return report;
    }
    let db_name = format!("chaos_{}_{}", name.replace('-', "_"), profile.label());
    let db = match Db::create(cluster, &db_name).await {
        Ok(db) => db,
        Err(e) => {
            report.error = Some(format!("creating the database: {e}"));
            return report;
        }
    };
    let clock = match db.now().await {
        Ok(now) => (now, Instant::now()),
        Err(e) => {
            report.error = Some(format!("reading the database clock: {e}"));
            return report;
        }
    };
    let fleet = Fleet::new(exe, &logs, "chaos-w");
    let mut h = Harness {
        cluster,
        db,
        fleet,
        rng: Rng::new(seed),
        quick: options.quick,
        profile,
        t,
        clock,
        marks: Vec::new(),
        t0: 0.0,
        started: Instant::now(),
        deadline: Instant::now() + SCENARIO_CAP,
        items: 0,
        faults: Vec::new(),
        recovery: Vec::new(),
        notes: Vec::new(),
        violations: Vec::new(),
        skipped: None,
        no_lapse: false,
        proxy: None,
        standby: None,
    };

    let ran = tokio::time::timeout(SCENARIO_CAP, scenarios::run(name, &mut h)).await;
    match ran {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report.error = Some(e.to_string()),
        Err(_) => report.error = Some(format!("overran {} s", SCENARIO_CAP.as_secs())),
    }
    let crashed = h.fleet.crashed();
    if !crashed.is_empty() {
        h.violations.push(format!(
            "worker(s) exited on their own: {} (see {})",
            crashed.join(", "),
            logs.display()
        ));
    }
    let drain_deadline = Instant::now() + Duration::from_secs_f64(h.t.shutdown_s + 15.0);
    let killed = h.fleet.stop_all(drain_deadline).await;
    if !killed.is_empty() {
        h.notes.push(format!(
            "did not drain in time at the end, killed: {}",
            killed.join(", ")
        ));
    }
    h.proxy.take();

    if let Some(skip) = h.skipped.take() {
        report.skipped = Some(skip);
    } else if report.error.is_none() || h.items > 0 {
        match Evidence::load(&h.db.pool).await {
            Ok(ev) => {
                h.conclude(&ev, &mut report);
                // What the suite enqueued, by its own count, against the ids recorded in the
                // database: a commit acknowledged to the suite and then lost (a failover to a
                // standby that lacked it) takes the item and its record away together, which
                // no check inside the database can see. (Only for a scenario that ran to its
                // end: one that failed may have left a feeder's chunk uncounted.)
                if report.error.is_none() && ev.enqueued.len() != h.items {
                    h.violations.push(format!(
                        "the suite enqueued {} items, but the database records {} enqueued \
                         ids: acknowledged commits are missing",
                        h.items,
                        ev.enqueued.len()
                    ));
                }
            }
            Err(e) => {
                report
                    .error
                    .get_or_insert(format!("reading the evidence: {e}"));
            }
        }
    }
    if let Some(standby) = h.standby.take() {
        match restore_primary(cluster, standby) {
            Ok(()) => h.notes.push(format!(
                "the standby was stopped and removed, and the {} cluster started again",
                cluster.name()
            )),
            Err(e) => {
                report.error.get_or_insert(e.to_string());
            }
        }
        if options.keep {
            h.notes.push(format!(
                "--keep: the promoted standby, which held the scenario's final database, was \
                 removed; the {} database kept on the chaos cluster is the old primary's copy, \
                 as of the crash",
                h.db.name
            ));
        }
    }
    report.violations.append(&mut h.violations);
    // A failed scenario keeps its database (audit, ledger, rows) for the diagnosis: the chaos
    // cluster's data directory holds it after the suite stops the cluster.
    let keep = options.keep || !report.passed();
    if keep && !options.keep {
        h.notes.push(format!(
            "the {} database was kept for the diagnosis (the scenario failed): start the chaos \
             cluster (target/workpump-pg/chaos) to read it",
            h.db.name
        ));
    }
    if let Err(e) = h.db.finish(keep).await {
        h.notes.push(format!("dropping the database: {e}"));
    }
    report.items = h.items;
    report.workers = h.fleet.procs.len();
    report.notes.append(&mut h.notes);
    report.recovery.append(&mut h.recovery);
    report.duration_s = began.elapsed().as_secs_f64();
    report.logs = logs.display().to_string();
    report
}

/// After a scenario with a standby: stops the standby and removes its data directory
/// (`Standby::stop`: its server by the pid in its `postmaster.pid`, `pg_ctl stop` waiting at
/// most 60 s, an immediate stop if the fast one fails; the primary's synchronous settings taken
/// back), then starts the chaos cluster again if it is down — a failover left it stopped —
/// for the next scenario (waiting at most 60 s). Runs only once no worker and no feeder is
/// left: with both servers up, a multi-host URL could find either one writable.
fn restore_primary(cluster: &Cluster, standby: Standby<'_>) -> Result<()> {
    let stopped = tokio::task::block_in_place(|| standby.stop());
    let started = tokio::task::block_in_place(|| cluster.start());
    stopped.map_err(|e| format!("stopping the standby: {e}"))?;
    started.map_err(|e| format!("starting the {} cluster again: {e}", cluster.name()))?;
    Ok(())
}

impl Harness<'_> {
    /// The profile's timing.
    pub(crate) fn timing(&self) -> fleet::Timing {
        self.t
    }

    /// A local instant on the database clock (seconds since the epoch).
    pub(crate) fn db_secs(&self, at: Instant) -> f64 {
        let (db, local) = self.clock;
        if at >= local {
            db + (at - local).as_secs_f64()
        } else {
            db - (local - at).as_secs_f64()
        }
    }

    /// The database clock now, without asking the database (which may be down).
    pub(crate) fn db_now(&self) -> f64 {
        self.db_secs(Instant::now())
    }

    /// Records a fault on the timeline (evictions are reported against the latest one) and
    /// prints it.
    pub(crate) fn mark(&mut self, label: &str) {
        self.marks.push((self.db_now(), label.to_owned()));
        self.say(label);
    }

    /// Waits until worker `index` holds at least one lease (so that a fault on it takes
    /// something away), at most until `deadline`; false if it never did.
    pub(crate) async fn wait_holding(&self, index: usize, deadline: Instant) -> bool {
        loop {
            if let Ok((_, held)) = self.leases_of(index).await {
                if !held.is_empty() {
                    return true;
                }
            }
            if Instant::now() >= deadline.min(self.deadline) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until some item runs, at most until `deadline`; how many run then (0: none
    /// did).
    pub(crate) async fn wait_running(&self, deadline: Instant) -> i64 {
        loop {
            if let Ok(n) = self.db.running().await {
                if n > 0 {
                    return n;
                }
            }
            if Instant::now() >= deadline.min(self.deadline) {
                return 0;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Watches for evictions for the profile's settle time (stale_after + lock grace + 2
    /// sweeps + 5 s) after `from`, the end of a fault (`what`: "the server's return", ...).
    pub(crate) async fn watch_settle(&mut self, from: Instant, what: &str) {
        let until = from + Duration::from_secs_f64(self.timing().settle_s());
        self.watch_until(
            until,
            &format!("stale_after + lock grace + 2 sweeps + 5 s from {what}"),
        )
        .await;
    }

    /// Watches until `until` for evictions (the window in which one caused by the last
    /// fault would show), printing each the store recorded since the last mark. The checks at the end
    /// judge them; this only makes the timeline readable. Tolerates a database that is
    /// briefly away.
    pub(crate) async fn watch_until(&mut self, until: Instant, why: &str) {
        let until = until.min(self.deadline);
        let secs = until
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        self.say(&format!("watching {secs:.0} s for evictions ({why})"));
        // Since the fault: an eviction may already have come while the suite measured the
        // recovery.
        let mut since = self.marks.last().map_or(self.t0, |(at, _)| *at);
        while Instant::now() < until {
            if let Ok(found) = self.db.evictions_since(since).await {
                for (instance, owner, reaper, at) in found {
                    self.say(&format!(
                        "EVICTED: {owner}'s instance {} by {reaper} ({:+.1}s)",
                        &instance.to_string()[..8],
                        at - self.t0
                    ));
                    since = since.max(at);
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(250))).await;
        }
    }

    /// Each worker's exits and freezes on the database clock.
    fn lifelines(&self) -> Vec<Lifeline> {
        self.fleet
            .procs
            .iter()
            .map(|p| {
                let mut line = Lifeline {
                    name: p.name.clone(),
                    ..Lifeline::default()
                };
                for &(at, life) in &p.life {
                    let at = self.db_secs(at);
                    match life {
                        Life::Exited => {
                            line.exited.get_or_insert(at);
                        }
                        Life::Frozen => line.frozen.push((at, None)),
                        Life::Thawed => {
                            if let Some(open) = line.frozen.iter_mut().rev().find(|f| f.1.is_none())
                            {
                                open.1 = Some(at);
                            }
                        }
                    }
                }
                line
            })
            .collect()
    }

    /// Starts the workers and waits for every `READY`.
    pub(crate) async fn start_workers(&mut self, specs: Vec<WorkerSpec>) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for spec in specs {
            self.fleet
                .start(spec.launch(&self.db.name), deadline)
                .await?;
        }
        Ok(())
    }

    /// Starts one worker (a replacement) and waits for its `READY`; its index.
    pub(crate) async fn start_worker(&mut self, spec: WorkerSpec) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(60);
        self.fleet.start(spec.launch(&self.db.name), deadline).await
    }

    /// A worker like the others, straight to the server.
    pub(crate) fn direct(&self, concurrency: usize) -> WorkerSpec {
        WorkerSpec::new(self.profile, self.cluster.port(), concurrency)
    }

    /// Enqueues the workload; its moment is the scenario's t = 0.
    pub(crate) async fn enqueue(&mut self, mix: &Mix) -> Result<()> {
        let planned = store::plan(&mut self.rng, mix);
        self.items = planned.len();
        self.t0 = self.db.now().await?;
        self.started = Instant::now();
        store::enqueue(&self.db.pool, planned).await?;
        println!(
            "   {} workers, {} items due over {:.0} s ({} settings)",
            self.fleet.procs.len(),
            self.items,
            mix.spread_ms as f64 / 1000.0,
            self.profile.label()
        );
        Ok(())
    }

    /// Seconds since t = 0.
    pub(crate) fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Waits until `secs` after t = 0 (at once if that has passed).
    pub(crate) async fn at(&self, secs: f64) {
        let when = self.started + Duration::from_secs_f64(secs.max(0.0));
        tokio::time::sleep_until(when.min(self.deadline)).await;
    }

    /// Prints a timeline line.
    pub(crate) fn say(&self, what: &str) {
        println!("   {:>+7.2}s {what}", self.elapsed());
    }

    /// Cancels a few items through the store, now.
    pub(crate) async fn cancel_some(&mut self, n: usize) -> Result<()> {
        let answers = store::cancel_some(&self.db, &mut self.rng, n).await?;
        let requested = answers.iter().filter(|(_, a)| a == "requested").count();
        let cancelled = answers.iter().filter(|(_, a)| a == "cancelled").count();
        self.say(&format!(
            "cancel_work on {} items: {requested} running (requested), {cancelled} waiting \
             (cancelled), {} already finished",
            answers.len(),
            answers.len() - requested - cancelled
        ));
        Ok(())
    }

    /// A random worker that runs and is not paused, other than `except`.
    pub(crate) fn pick(&mut self, except: &[usize]) -> Option<usize> {
        let live: Vec<usize> = self
            .fleet
            .live()
            .into_iter()
            .filter(|i| !self.fleet.procs[*i].stopped && !except.contains(i))
            .collect();
        (!live.is_empty()).then(|| live[self.rng.below(live.len())])
    }

    /// The instances worker `index` ran as, and the leases they hold now.
    pub(crate) async fn leases_of(&self, index: usize) -> Result<(Vec<Uuid>, Vec<(i64, i64)>)> {
        let proc = &self.fleet.procs[index];
        let instances = self.db.instances_of(&proc.name, proc.instance).await?;
        let held = self.db.held_by(&instances).await?;
        Ok((instances, held))
    }

    /// Waits until every item finished or `until` passes (then the checks report what was
    /// left). Tolerates a database that is briefly away.
    pub(crate) async fn wait_finished(&mut self, until: Instant) {
        let until = until.min(self.deadline);
        let mut last_line = Instant::now();
        loop {
            if let Ok(p) = self.db.progress().await {
                if p.total > 0 && p.finished == p.total {
                    self.say(&format!("all {} items finished", p.total));
                    return;
                }
                if last_line.elapsed() >= Duration::from_secs(10) {
                    self.say(&format!(
                        "{} of {} finished, {} running",
                        p.finished, p.total, p.running
                    ));
                    last_line = Instant::now();
                }
            }
            if Instant::now() >= until {
                self.say("deadline: not every item finished");
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The deadline for the work to finish: `secs` after t = 0.
    pub(crate) fn finish_by(&self, secs: f64) -> Instant {
        self.started + Duration::from_secs_f64(secs)
    }

    /// Checks, recovery from the faults, and the report's figures.
    fn conclude(&mut self, ev: &Evidence, report: &mut Report) {
        let verdict = check::check(ev, self.t0);
        for fault in &self.faults {
            if let Some(why) = fault.vacuous() {
                self.violations.push(why);
            }
            let procs: Vec<&str> = fault.procs.iter().map(String::as_str).collect();
            let rerun = check::rerun(ev, fault.at, &fault.affected, &procs);
            let reaped = fault
                .instances
                .iter()
                .filter_map(|i| ev.evicted.get(i))
                .filter(|t| fault.until.is_none_or(|u| **t <= u + 1.0))
                .map(|t| t - fault.at)
                .filter(|d| *d >= 0.0)
                .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.min(d))));
            let mut detail = format!("{} leases held", rerun.affected);
            if let Some(r) = reaped {
                detail.push_str(&format!("; instance reaped after {r:.1} s"));
            }
            if rerun.affected > 0 {
                detail.push_str(&format!(
                    "; {} taken over by peers, {} finished by the process itself, {} claimed \
                     back by it",
                    rerun.by_peer, rerun.own_outcomes, rerun.own_claims
                ));
            }
            if !rerun.stuck.is_empty() {
                detail.push_str(&format!("; {} never ran again", rerun.stuck.len()));
                self.violations.push(format!(
                    "{}: {} of the {} leases it held never ran again: (item, token) {:?}",
                    fault.label,
                    rerun.stuck.len(),
                    rerun.affected,
                    rerun.stuck
                ));
            }
            // With no lease held, recovery is the reaping (when measured).
            let seconds = if rerun.affected > 0 {
                rerun.all_after
            } else {
                reaped
            };
            self.recovery.push(Recovery {
                label: fault.label.clone(),
                seconds,
                bound: fault.bound,
                bound_why: fault.bound_why.clone(),
                detail,
            });
        }
        for r in &self.recovery {
            if let Some(s) = r.seconds {
                if s > r.bound {
                    self.violations.push(format!(
                        "recovery over its bound: {} took {s:.1} s, bound {:.1} s ({})",
                        r.label, r.bound, r.bound_why
                    ));
                }
            }
        }
        if self.no_lapse && verdict.lapsed > 0 {
            self.violations.push(format!(
                "{} leases lapsed while their owner was registered and no fault took them \
                 (their items were reclaimed as `stopped renewing`)",
                verdict.lapsed
            ));
        }
        // Evictions, from the store's own records, judged against what each process was
        // doing (a freeze's stale state reaches the store at its thaw: the lock grace and
        // two sweeps later it is the freeze's, not a live eviction).
        let thaw_window = self.t.lock_grace_s + 2.0 * self.t.sweep_s + 1.0;
        let evictions = check::evictions(ev);
        let (bad, notes) = check::judge_evictions(
            &evictions,
            &self.lifelines(),
            self.t.stale_after_s,
            thaw_window,
            &self.marks,
            self.t0,
        );
        report.bad_evictions = bad.len();
        self.notes.extend(notes);
        self.violations.extend(bad);
        let kinds = check::kinds(ev);
        self.notes.push(format!(
            "workload: {}",
            kinds
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        self.notes.push(format!(
            "{} executions, {} items run more than once, {} claims of orphans ({} after a lapsed \
             lease), {} executions whose outcome did not land (killed, fenced out or abandoned)",
            verdict.executions,
            verdict.redelivered,
            verdict.reclaims,
            verdict.lapsed,
            verdict.unrecorded
        ));
        report.set_verdict(&verdict);
        report.lapsed = verdict.lapsed;
        report.reclaims = verdict.reclaims;
        report.evictions = ev.evicted.len();
        report.details.extend(verdict.violations().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_that_took_no_lease_away_is_vacuous() {
        let mut fault = Fault {
            label: "SIGKILL chaos-w1".into(),
            at: 0.0,
            until: None,
            procs: vec!["chaos-w1".into()],
            instances: Vec::new(),
            affected: Vec::new(),
            bound: 8.0,
            bound_why: String::new(),
        };
        assert!(fault
            .vacuous()
            .is_some_and(|why| why.starts_with("vacuous: SIGKILL chaos-w1")));
        fault.affected.push((1, 10));
        assert!(fault.vacuous().is_none());
    }
}
