//! What every scenario shares: a fresh database, the fleet, the workload, the timeline of
//! faults, the wait for the end, the drain, the checks and the report.

use std::path::Path;
use std::time::Duration;

use sqlx::types::Uuid;
use tokio::time::Instant;
use workpump_testdb::Cluster;

use super::check::{self, Evidence};
use super::fleet::{self, Fleet, Profile, WorkerSpec};
use super::proxy::Proxy;
use super::report::{Recovery, Report};
use super::store::{self, Db, Mix};
use super::{scenarios, Options, Result, Rng};

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

pub(crate) struct Harness<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) db: Db,
    pub(crate) fleet: Fleet,
    pub(crate) rng: Rng,
    pub(crate) quick: bool,
    pub(crate) profile: Profile,
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
    /// No instance may be reaped (every worker lives throughout).
    pub(crate) no_eviction: bool,
    /// Kept until the workers behind it drained.
    pub(crate) proxy: Option<Proxy>,
}

pub(crate) async fn run_scenario(
    name: &'static str,
    cluster: &Cluster,
    exe: &Path,
    logs: &Path,
    seed: u64,
    options: &Options,
) -> Report {
    let began = Instant::now();
    let mut report = Report::new(name, seed);
    println!("── {name} (seed {seed})");
    let logs = logs.join(name);
    if let Err(e) = std::fs::create_dir_all(&logs) {
        report.error = Some(format!("creating {}: {e}", logs.display()));
        return report;
    }
    let db_name = format!("chaos_{}", name.replace('-', "_"));
    let db = match Db::create(cluster, &db_name).await {
        Ok(db) => db,
        Err(e) => {
            report.error = Some(format!("creating the database: {e}"));
            return report;
        }
    };
    let fleet = Fleet::new(exe, &logs, &db_name);
    let mut h = Harness {
        cluster,
        db,
        fleet,
        rng: Rng::new(seed),
        quick: options.quick,
        profile: Profile::Short,
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
        no_eviction: false,
        proxy: None,
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
    let drain_deadline =
        Instant::now() + Duration::from_secs(h.profile.timing().shutdown_s as u64 + 15);
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
            Ok(ev) => h.conclude(&ev, &mut report),
            Err(e) => {
                report
                    .error
                    .get_or_insert(format!("reading the evidence: {e}"));
            }
        }
    }
    if let Err(e) = h.db.finish(options.keep).await {
        h.notes.push(format!("dropping the database: {e}"));
    }
    report.profile = h.profile.label();
    report.items = h.items;
    report.workers = h.fleet.procs.len();
    report.notes.append(&mut h.notes);
    report.violations.append(&mut h.violations);
    report.recovery.append(&mut h.recovery);
    report.duration_s = began.elapsed().as_secs_f64();
    report.logs = logs.display().to_string();
    report
}

impl Harness<'_> {
    /// The profile's timing.
    pub(crate) fn timing(&self) -> fleet::Timing {
        self.profile.timing()
    }

    /// Starts the workers and waits for every `READY`.
    pub(crate) async fn start_workers(&mut self, specs: Vec<WorkerSpec>) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for spec in specs {
            self.fleet.start(spec, deadline).await?;
        }
        Ok(())
    }

    /// Starts one worker (a replacement) and waits for its `READY`; its index.
    pub(crate) async fn start_worker(&mut self, spec: WorkerSpec) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(60);
        self.fleet.start(spec, deadline).await
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
        store::enqueue(&self.db, planned).await?;
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
            if rerun.stuck > 0 {
                detail.push_str(&format!("; {} never ran again", rerun.stuck));
                self.violations.push(format!(
                    "{}: {} of the {} leases it held never ran again",
                    fault.label, rerun.stuck, rerun.affected
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
        if self.no_eviction && !ev.evicted.is_empty() {
            let owners: Vec<String> = ev
                .evicted
                .keys()
                .map(|id| {
                    let proc = ev
                        .changes
                        .iter()
                        .find(|c| c.to_instance == Some(*id))
                        .map(|c| c.proc.clone())
                        .or_else(|| {
                            self.fleet
                                .procs
                                .iter()
                                .find(|p| p.instance == Some(*id))
                                .map(|p| p.name.clone())
                        })
                        .unwrap_or_else(|| "?".into());
                    format!("{id} ({proc}) at +{:.1} s", ev.evicted[id] - self.t0)
                })
                .collect();
            self.violations.push(format!(
                "{} live instance(s) evicted: {}",
                ev.evicted.len(),
                owners.join(", ")
            ));
        }
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
        for list in [
            &verdict.lost,
            &verdict.double,
            &verdict.effects,
            &verdict.history,
        ] {
            report.details.extend(list.iter().cloned());
        }
    }
}
