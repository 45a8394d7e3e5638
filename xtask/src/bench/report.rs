//! The figures: one named JSON field each (`--json`), and the table on stdout with every
//! figure against its target, followed by the details (drain runs, where the drain's database
//! time went, the ceiling runs, renewal and idle statement breakdowns, failover runs).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::ceiling::CeilingRun;
use super::drain::{DrainRun, Pairs};
use super::enqueue::{EnqueueRates, BULK_BATCH};
use super::failover::FailoverRun;
use super::flow::{self, FleetLimit, Rate};
use super::idle::{Idle, WORKERS as IDLE_WORKERS};
use super::keyed::{self, Keyed};
use super::ops::{DashboardCost, OpsTimings};
use super::pickup::Pickup;
use super::renewal::{Renewal, LEASE_MS};
use super::setup;
use super::upkeep::{Upkeep, INSTANCES as UPKEEP_INSTANCES};
use super::SMALL_CLAIMS_CONCURRENCY;
use super::{BenchResult, Ctx};

/// Drain target: items per second.
const DRAIN_TARGET: f64 = 65_000.0;
/// Drain target: fraction of the batched ceiling.
const DRAIN_CEILING_TARGET: f64 = 0.70;
/// Bulk enqueue target: items per second.
const BULK_TARGET: f64 = 150_000.0;
/// Pickup targets, ms.
const PICKUP_P50_TARGET: f64 = 1.5;
const PICKUP_P99_TARGET: f64 = 3.0;
/// Renewal target: in-flight items per renew statement per renewal interval.
const RENEW_ITEMS_PER_STATEMENT: f64 = 200.0;
/// Heartbeat cadence while the alive-lock is held (the default slow interval), s.
const HEARTBEAT_SLOW_S: f64 = 60.0;
/// Failover target, s.
const FAILOVER_TARGET: f64 = 5.0;
/// Idle target: statements per second per instance with the listener healthy.
const IDLE_TARGET: f64 = 1.0;
/// The operator's reads (a page of items, the queue overview) on a large store, ms.
const OPS_READ_TARGET_MS: f64 = 50.0;
/// The drain with the dashboard open beside it, over the drain alone.
const DASHBOARD_RATIO_TARGET: f64 = 0.97;
/// Memory target, MB.
const RSS_TARGET: f64 = 100.0;
/// The keyed drain (100 000 items over 10 000 keys) over the plain drain of the same run.
const KEYED_RATIO_TARGET: f64 = 0.70;
/// One hot key: items per second.
const HOT_KEY_TARGET: f64 = 300.0;
/// The drain limited to 50 running over the unlimited drain, when the limit is not the
/// bottleneck.
const FLEET_LIMIT_RATIO_TARGET: f64 = 0.90;
/// The share of the unlimited free drain's samples below the limit for "the limit is not the
/// bottleneck" to hold.
const FLEET_LIMIT_FREE_SHARE: f64 = 0.90;
/// The rate limit's starts per second may deviate this much over the window.
const RATE_DEVIATION_TARGET: f64 = 0.02;
/// The small-claims drain's late tenths (8–10) must go at least this fast against its early
/// ones (2–4): the queue does not slow as it drains.
const SMALL_CLAIMS_FLAT_TARGET: f64 = 0.90;

pub(crate) struct Report {
    figures: Map<String, Value>,
    details: Map<String, Value>,
    errors: Vec<(String, String)>,
    drains: Vec<(usize, Vec<DrainRun>)>,
    drain_deep: Option<DrainRun>,
    small_claims: Option<DrainRun>,
    keyed: Option<Keyed>,
    fleet_limit: Option<FleetLimit>,
    rate: Option<Rate>,
    ceiling: Vec<CeilingRun>,
    renewals: Vec<Renewal>,
    pickup: Option<Pickup>,
    idles: Vec<Idle>,
    upkeep: Option<Upkeep>,
    failovers: Vec<(bool, Vec<FailoverRun>)>,
    machine: Vec<(String, String)>,
    quick: bool,
}

impl Report {
    pub(crate) async fn new(ctx: &Ctx) -> BenchResult<Report> {
        let mut machine = vec![
            (
                "date".to_owned(),
                command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            ),
            ("nproc".to_owned(), ctx.nproc.to_string()),
            ("memory".to_owned(), mem_total()),
            ("kernel".to_owned(), command_line("uname", &["-r"])),
            ("server".to_owned(), ctx.target.describe()),
            (
                "worker".to_owned(),
                match &ctx.options.worker_bin {
                    Some(path) => format!("{} (--worker-bin)", path.display()),
                    None => format!("built from the working tree at {}", git_state()),
                },
            ),
            (
                "load average at start".to_owned(),
                setup::load_average().map_or("?".to_owned(), |l| format!("{l:.2}")),
            ),
            (
                "fdatasync 8 kB at start".to_owned(),
                setup::fdatasync_ms(&ctx.logs).map_or("?".to_owned(), |ms| format!("{ms} ms")),
            ),
            (
                "drain worker concurrency".to_owned(),
                ctx.options.drain_concurrency.to_string(),
            ),
        ];
        machine.extend(ctx.target.server_info().await?);
        Ok(Report {
            figures: Map::new(),
            details: Map::new(),
            errors: Vec::new(),
            drains: Vec::new(),
            drain_deep: None,
            small_claims: None,
            keyed: None,
            fleet_limit: None,
            rate: None,
            ceiling: Vec::new(),
            renewals: Vec::new(),
            pickup: None,
            idles: Vec::new(),
            upkeep: None,
            failovers: Vec::new(),
            machine,
            quick: ctx.options.quick,
        })
    }

    fn set(&mut self, name: &str, value: impl Into<Value>) {
        self.figures.insert(name.to_owned(), value.into());
    }

    fn num(&self, name: &str) -> Option<f64> {
        self.figures.get(name).and_then(Value::as_f64)
    }

    pub(crate) fn ceiling(&mut self, runs: Vec<CeilingRun>) {
        for r in &runs {
            let name = match r.script {
                "single" => format!("ceiling_single_{}", r.clients),
                "batch100" => format!("ceiling_batch100_{}", r.clients),
                _ => format!("ceiling_two_step100_{}", r.clients),
            };
            self.set(&name, r.rows_per_s.round());
        }
        let best = |script: &str| {
            runs.iter()
                .filter(|r| r.script == script)
                .map(|r| r.rows_per_s)
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        };
        if let Some(b) = best("batch100") {
            self.set("ceiling_batch100", b.round());
        }
        if let Some(b) = best("two_step100") {
            self.set("ceiling_two_step100", b.round());
        }
        self.details.insert(
            "ceiling_runs".into(),
            runs.iter().map(CeilingRun::to_json).collect(),
        );
        self.ceiling = runs;
    }

    pub(crate) fn drain(&mut self, workers: usize, runs: Vec<DrainRun>) {
        let mut rates: Vec<f64> = runs.iter().map(|r| r.rate).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        self.set(&format!("drain_{workers}"), median.round());
        self.set(&format!("drain_{workers}_min"), rates[0].round());
        self.set(
            &format!("drain_{workers}_max"),
            rates[rates.len() - 1].round(),
        );
        self.details.insert(
            format!("drain_{workers}_runs"),
            runs.iter().map(DrainRun::to_json).collect(),
        );
        self.drains.push((workers, runs));
    }

    /// The worker count with the best median drain so far.
    pub(crate) fn best_drain_workers(&self) -> Option<usize> {
        self.drains
            .iter()
            .filter_map(|(n, _)| self.num(&format!("drain_{n}")).map(|r| (*n, r)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(n, _)| n)
    }

    pub(crate) fn drain_deep(&mut self, run: DrainRun) {
        let name = if run.workers == 4 {
            "drain_4_1m".to_owned()
        } else {
            format!("drain_{}_1m", run.workers)
        };
        self.set(&name, run.rate.round());
        if name != "drain_4_1m" {
            self.set("drain_4_1m", run.rate.round());
        }
        self.details.insert("drain_1m_run".into(), run.to_json());
        self.drain_deep = Some(run);
    }

    /// The small-claims drain: its rate, how its late tenths went against its early ones, and
    /// the claims' size and database time.
    pub(crate) fn small_claims(&mut self, run: DrainRun) {
        self.set("small_claims_drain", run.rate.round());
        if let Some(rates) = &run.decile_rates {
            // The rate over tenths `from..=to` (1-based): a tenth of the items each, so the
            // harmonic mean of their rates.
            let span = |from: usize, to: usize| {
                let tenths = &rates[from - 1..to];
                tenths.len() as f64 / tenths.iter().map(|r| 1.0 / r.max(1e-9)).sum::<f64>()
            };
            if rates.len() == 10 {
                self.set(
                    "small_claims_late_over_early",
                    round3(span(8, 10) / span(2, 4)),
                );
            }
        }
        if let Some(claim) = run
            .statements
            .iter()
            .find(|st| st.query.contains("claim_work("))
        {
            if claim.calls > 0 {
                self.set(
                    "small_claims_items_per_claim",
                    (claim.rows as f64 / claim.calls as f64 * 10.0).round() / 10.0,
                );
                self.set(
                    "small_claims_claim_ms",
                    round3(claim.total_ms / claim.calls as f64),
                );
            }
        }
        self.details
            .insert("small_claims_run".into(), run.to_json());
        self.small_claims = Some(run);
    }

    pub(crate) fn keyed(&mut self, k: Keyed) {
        let keyed = Pairs::median(&k.pairs.variant);
        let plain = Pairs::median(&k.pairs.base);
        self.set("keyed_drain", keyed.round());
        self.set("keyed_plain_drain", plain.round());
        self.set("keyed_over_unkeyed", round3(k.pairs.ratio()));
        self.set(
            "keyed_enqueue",
            Keyed::enqueue_median(&k.pairs.variant).round(),
        );
        self.set(
            "keyed_plain_enqueue",
            Keyed::enqueue_median(&k.pairs.base).round(),
        );
        if !k.hot.is_empty() {
            self.set("hot_key", Pairs::median(&k.hot).round());
        }
        if let Some((p50, p90)) = k.hot_gap_ms() {
            self.set("hot_key_item_ms_p50", p50);
            self.set("hot_key_item_ms_p90", p90);
        }
        self.details.insert("keyed".into(), k.to_json());
        self.keyed = Some(k);
    }

    pub(crate) fn fleet_limit(&mut self, f: FleetLimit) {
        let limited: Vec<DrainRun> = f
            .bound
            .variant
            .iter()
            .chain(&f.free.variant)
            .cloned()
            .collect();
        if let Some(max) = FleetLimit::max_running(&limited) {
            self.set("fleet_limit_max_running", max);
        }
        if let Some(max) = FleetLimit::max_running(&f.bound.variant) {
            self.set("fleet_limit_bound_max_running", max);
        }
        if let Some(max) = FleetLimit::max_running(&f.bound.base) {
            self.set("fleet_limit_bound_unlimited_max_running", max);
        }
        self.set(
            "fleet_limit_bound_drain",
            Pairs::median(&f.bound.variant).round(),
        );
        self.set(
            "fleet_limit_bound_unlimited_drain",
            Pairs::median(&f.bound.base).round(),
        );
        if let Some(max) = FleetLimit::max_running(&f.free.base) {
            self.set("fleet_limit_free_unlimited_max_running", max);
        }
        if let Some(share) = FleetLimit::share_below(&f.free.base) {
            self.set("fleet_limit_free_unlimited_share_below", round3(share));
        }
        self.set(
            "fleet_limit_free_drain",
            Pairs::median(&f.free.variant).round(),
        );
        self.set(
            "fleet_limit_free_unlimited_drain",
            Pairs::median(&f.free.base).round(),
        );
        self.set("fleet_limit_free_ratio", round3(f.free.ratio()));
        self.details.insert("fleet_limit".into(), f.to_json());
        self.fleet_limit = Some(f);
    }

    pub(crate) fn rate(&mut self, r: Rate) {
        if let Some((per_s, deviation)) = r.median() {
            self.set("rate_limit_per_s", round2(per_s));
            self.set("rate_limit_deviation", round3(deviation));
        }
        if let Some(worst) = r.worst_deviation() {
            self.set("rate_limit_worst_deviation", round3(worst));
        }
        if let Some(used) = r.bucket_use() {
            self.set("rate_limit_bucket_use", round3(used));
        }
        self.details.insert("rate".into(), r.to_json());
        self.rate = Some(r);
    }

    pub(crate) fn enqueue(&mut self, r: EnqueueRates) {
        self.set("enqueue_single_1", r.single_1.round());
        self.set("enqueue_single_16", r.single_16.round());
        self.set("enqueue_bulk", r.bulk.round());
        self.set("enqueue_single_1_no_ping", r.single_1_no_ping.round());
        self.set("enqueue_bulk_wal_bytes_per_item", r.bulk_wal_bytes_per_item);
        self.set("enqueue_tx_16_notify", r.tx_16_notify.round());
        self.set("enqueue_tx_16_deferred", r.tx_16_deferred.round());
        if let Some(w) = r.wakes_per_item_single_16 {
            self.set("enqueue_single_16_wakes_per_item", round3(w));
        }
        if let Some(w) = r.wakes_per_item_tx_16_deferred {
            self.set("enqueue_tx_16_deferred_wakes_per_item", round3(w));
        }
        self.details.insert(
            "enqueue".into(),
            json!({
                "producer_cpu_us_per_item_single_1": r.producer_cpu_us_single_1,
                "producer_cpu_us_per_item_bulk": r.producer_cpu_us_bulk,
            }),
        );
    }

    /// `p` at the defaults; `a` with the queue's claims committed asynchronously.
    pub(crate) fn pickup(&mut self, p: Pickup, a: Pickup) {
        self.set("pickup_p50_ms", p.p50);
        self.set("pickup_p90_ms", p.p90);
        self.set("pickup_p99_ms", p.p99);
        self.set("pickup_max_ms", p.max);
        self.set("pickup_async_p50_ms", a.p50);
        self.set("pickup_async_p99_ms", a.p99);
        self.set("pickup_async_max_ms", a.max);
        self.details.insert(
            "pickup".into(),
            json!({
                "samples": p.samples,
                "upper_bound_p50_ms": p.upper_p50,
                "upper_bound_p99_ms": p.upper_p99,
                "enqueue_round_trip_p50_ms": p.enqueue_rtt_p50,
                "db_clock_enqueue_to_complete_p50_ms": p.db_enqueue_to_complete_p50,
                "db_clock_enqueue_to_complete_p99_ms": p.db_enqueue_to_complete_p99,
                "statements": p.statements.iter().take(8).map(|s| json!({
                    "statement": setup::short_name(&s.query),
                    "calls": s.calls,
                    "mean_ms": round3(s.total_ms / s.calls.max(1) as f64),
                })).collect::<Vec<_>>(),
            }),
        );
        self.pickup = Some(p);
    }

    pub(crate) fn renewal(&mut self, r: Renewal) {
        let suffix = if r.warm_stats { "_warm_stats" } else { "" };
        self.set(
            &format!("renew_statements_per_min{suffix}"),
            r.renew_statements_per_min.round(),
        );
        self.set(
            &format!("renew_rows_per_min{suffix}"),
            r.renew_rows_per_min.round(),
        );
        self.set(
            &format!("renew_failed_items_per_min{suffix}"),
            r.failed_items_per_min.round(),
        );
        self.set(
            &format!("renew_lost_before_window{suffix}"),
            r.lost_before_window,
        );
        self.set(
            &format!("heartbeat_statements_per_min{suffix}"),
            round2(r.heartbeat_statements_per_min),
        );
        self.set(
            &format!("rss_mb_10k_inflight{suffix}"),
            round2(r.rss_peak_mb),
        );
        self.details.insert(format!("renewal{suffix}"), r.to_json());
        self.renewals.push(r);
    }

    pub(crate) fn failover(&mut self, short: bool, runs: Vec<FailoverRun>) {
        let mut totals: Vec<f64> = runs.iter().map(|r| r.total_s).collect();
        totals.sort_by(f64::total_cmp);
        let median = totals[totals.len() / 2];
        let name = if short {
            "failover_short_median_s"
        } else {
            "failover_median_s"
        };
        self.set(name, round2(median));
        self.details.insert(
            format!("{}_runs", name.trim_end_matches("_median_s")),
            runs.iter()
                .map(
                    |r| json!({ "total_s": round2(r.total_s), "reaped_s": r.reaped_s.map(round2), "kill_phase_s": round2(r.kill_phase_s) }),
                )
                .collect(),
        );
        self.failovers.push((short, runs));
    }

    pub(crate) fn idle(&mut self, idle: Idle) {
        let state = if idle.listener { "up" } else { "down" };
        self.set(
            &format!("idle_statements_per_s_listener_{state}"),
            round2(idle.statements_per_s),
        );
        self.set(
            &format!("idle_statements_per_s_per_instance_listener_{state}"),
            round2(idle.statements_per_s / IDLE_WORKERS as f64),
        );
        self.details
            .insert(format!("idle_listener_{state}"), idle.to_json());
        self.idles.push(idle);
    }

    pub(crate) fn upkeep(&mut self, u: Upkeep) {
        self.set("upkeep_ms_per_s", round2(u.turns.ms_per_s));
        self.set("upkeep_every_call_ms_per_s", round2(u.every_call.ms_per_s));
        self.set("upkeep_turns_over_every_call", round3(u.ratio()));
        self.details.insert("upkeep".into(), u.to_json());
        self.upkeep = Some(u);
    }

    pub(crate) fn ops(&mut self, t: OpsTimings) {
        let figure = |name: &str| t.get(name).map(|x| x.median_ms);
        if let Some(ms) = figure("list_work: 100 items") {
            self.set("ops_page_100_ms", ms);
        }
        if let Some(ms) = figure("list_work: 100 dead letters of the queue") {
            self.set("ops_page_100_dead_ms", ms);
        }
        if let Some(ms) = figure("queue_overview") {
            self.set("ops_queue_overview_ms", ms);
        }
        self.set("ops_items", t.items as f64);
        self.details.insert("ops".into(), t.to_json());
    }

    pub(crate) fn dashboard(&mut self, c: DashboardCost) {
        self.set("drain_with_dashboard_ratio", round3(c.ratio()));
        self.details.insert("dashboard".into(), c.to_json());
    }

    pub(crate) fn error(&mut self, scenario: &str, message: &str) {
        self.errors.push((scenario.to_owned(), message.to_owned()));
    }

    pub(crate) fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// Derived figures (drain over ceiling) and the run's duration.
    pub(crate) fn finish(&mut self, elapsed: Duration, logs: &std::path::Path) {
        self.machine.push((
            "load average at end".to_owned(),
            setup::load_average().map_or("?".to_owned(), |l| format!("{l:.2}")),
        ));
        self.machine.push((
            "fdatasync 8 kB at end".to_owned(),
            setup::fdatasync_ms(logs).map_or("?".to_owned(), |ms| format!("{ms} ms")),
        ));
        if let Some(ceiling) = self.num("ceiling_batch100") {
            let mut best: Option<f64> = None;
            for (n, _) in self.drains.clone() {
                if let Some(d) = self.num(&format!("drain_{n}")) {
                    self.set(&format!("drain_{n}_over_ceiling"), round3(d / ceiling));
                    best = Some(best.map_or(d, |b: f64| b.max(d)));
                }
            }
            if let Some(d) = self.num("drain_4_1m") {
                self.set("drain_4_1m_over_ceiling", round3(d / ceiling));
            }
            if let Some(best) = best {
                self.set("drain_over_ceiling", round3(best / ceiling));
            }
        }
        self.details
            .insert("bench_seconds".into(), elapsed.as_secs().into());
    }

    pub(crate) fn json(&self) -> String {
        let mut all = self.figures.clone();
        all.insert(
            "mode".into(),
            if self.quick { "quick" } else { "full" }.into(),
        );
        all.insert(
            "machine".into(),
            self.machine
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.clone())))
                .collect::<Map<_, _>>()
                .into(),
        );
        all.insert("details".into(), self.details.clone().into());
        all.insert(
            "errors".into(),
            self.errors
                .iter()
                .map(|(s, e)| json!({ "scenario": s, "error": e }))
                .collect(),
        );
        serde_json::to_string_pretty(&Value::Object(all)).unwrap_or_default() + "\n"
    }

    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nworkpump bench ({} mode)",
            if self.quick { "quick" } else { "full" }
        );
        for (k, v) in &self.machine {
            let _ = writeln!(out, "  {k:<26} {v}");
        }
        let rows = self.rows();
        let _ = writeln!(
            out,
            "\n{:<40} {:>14}  {:<30} verdict",
            "figure", "value", "target"
        );
        let _ = writeln!(out, "{}", "-".repeat(96));
        for (name, value, target, verdict) in rows {
            let _ = writeln!(out, "{name:<40} {value:>14}  {target:<30} {verdict}");
        }
        self.details_text(&mut out);
        for (scenario, error) in &self.errors {
            let _ = writeln!(out, "\nERROR in {scenario}: {error}");
        }
        out
    }

    /// (figure, value, target, verdict) in a fixed order; missing figures are left out.
    fn rows(&self) -> Vec<(String, String, String, &'static str)> {
        let mut rows = Vec::new();
        let ceiling = self.num("ceiling_batch100");
        let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
        let mut push =
            |name: &str, value: Option<f64>, unit: &str, target: String, ok: Option<bool>| {
                if let Some(v) = value {
                    let shown = if v.abs() >= 100.0 {
                        format!("{} {unit}", group(v))
                    } else {
                        format!("{v} {unit}")
                    };
                    rows.push((
                        name.to_owned(),
                        shown.trim_end().to_owned(),
                        target,
                        ok.map_or("", verdict),
                    ));
                }
            };
        for n in [1, 2, 4] {
            let v = self.num(&format!("drain_{n}"));
            let ok = v.map(|v| {
                v >= DRAIN_TARGET && ceiling.is_none_or(|c| v >= DRAIN_CEILING_TARGET * c)
            });
            push(
                &format!("drain_{n} (median)"),
                v,
                "/s",
                ">= 65 000/s and >= 70 % ceiling".to_owned(),
                ok,
            );
            if let (Some(lo), Some(hi)) = (
                self.num(&format!("drain_{n}_min")),
                self.num(&format!("drain_{n}_max")),
            ) {
                if self.drains.iter().any(|(w, r)| *w == n && r.len() > 1) {
                    push(
                        &format!("drain_{n} min / max"),
                        Some(lo),
                        "/s",
                        format!("max {}", group(hi)),
                        None,
                    );
                }
            }
            push(
                &format!("drain_{n}_over_ceiling"),
                self.num(&format!("drain_{n}_over_ceiling")),
                "",
                ">= 0.70".into(),
                self.num(&format!("drain_{n}_over_ceiling"))
                    .map(|r| r >= DRAIN_CEILING_TARGET),
            );
        }
        if let Some(k) = &self.keyed {
            let ratio = self.num("keyed_over_unkeyed");
            push(
                &format!(
                    "keyed_drain ({} items, {} keys, {} workers)",
                    group(keyed::ITEMS as f64),
                    group(keyed::KEYS as f64),
                    k.workers
                ),
                self.num("keyed_drain"),
                "/s",
                String::new(),
                None,
            );
            push(
                "keyed_over_unkeyed (median of pairs)",
                ratio,
                "",
                ">= 0.70".into(),
                ratio.map(|r| r >= KEYED_RATIO_TARGET),
            );
            let hot = self.num("hot_key");
            push(
                &format!(
                    "hot_key ({} items, one key)",
                    group(keyed::HOT_KEY_ITEMS as f64)
                ),
                hot,
                "/s",
                ">= 300/s".into(),
                hot.map(|v| v >= HOT_KEY_TARGET),
            );
            push(
                "hot_key_item_ms_p50 (completion to next)",
                self.num("hot_key_item_ms_p50"),
                "ms",
                String::new(),
                None,
            );
        }
        if let Some(f) = &self.fleet_limit {
            let reached = self.num("fleet_limit_bound_max_running");
            let max = self.num("fleet_limit_max_running");
            let limit = f64::from(flow::FLEET_LIMIT);
            push(
                "fleet_limit_max_running (limited drains, sampled)",
                max,
                "",
                "<= 50, and 50 reached".into(),
                max.map(|m| m <= limit && reached == Some(limit)),
            );
            let unlimited = self.num("fleet_limit_bound_unlimited_max_running");
            push(
                &format!(
                    "fleet_limit_bound_unlimited_max_running ({} ms items)",
                    flow::BOUND_HANDLER_MS
                ),
                unlimited,
                "",
                "> 50 (the limit binds)".into(),
                unlimited.map(|m| m > limit),
            );
            push(
                &format!("fleet_limit_bound_drain (limited, {} workers)", f.workers),
                self.num("fleet_limit_bound_drain"),
                "/s",
                format!(
                    "<= {} (50 / {} ms)",
                    group(limit * 1_000.0 / flow::BOUND_HANDLER_MS as f64),
                    flow::BOUND_HANDLER_MS
                ),
                None,
            );
            let share = self.num("fleet_limit_free_unlimited_share_below");
            push(
                &format!(
                    "fleet_limit_free_unlimited_share_below_50 ({} handlers)",
                    f.free_concurrency * f.workers
                ),
                share,
                "",
                ">= 0.90 (not the bottleneck)".into(),
                share.map(|s| s >= FLEET_LIMIT_FREE_SHARE),
            );
            push(
                &format!("fleet_limit_free_drain (limited, {} workers)", f.workers),
                self.num("fleet_limit_free_drain"),
                "/s",
                String::new(),
                None,
            );
            let ratio = self.num("fleet_limit_free_ratio");
            push(
                "fleet_limit_free_ratio (median of pairs)",
                ratio,
                "",
                ">= 0.90".into(),
                ratio.map(|r| r >= FLEET_LIMIT_RATIO_TARGET),
            );
        }
        if let Some(r) = &self.rate {
            let deviation = self.num("rate_limit_deviation");
            push(
                &format!(
                    "rate_limit_per_s (1 000/s, {:.0} s window, {} workers)",
                    r.runs
                        .first()
                        .and_then(|run| run.rate_window.as_ref())
                        .map_or(0.0, |w| w.window_s),
                    r.workers
                ),
                self.num("rate_limit_per_s"),
                "/s",
                "1 000/s within 2 %".into(),
                deviation.map(|d| d.abs() <= RATE_DEVIATION_TARGET),
            );
            push(
                "rate_limit_worst_deviation (of the runs)",
                self.num("rate_limit_worst_deviation"),
                "",
                String::new(),
                None,
            );
            let used = self.num("rate_limit_bucket_use");
            push(
                "rate_limit_bucket_use (started by the window's end / burst + refill)",
                used,
                "",
                "<= 1".into(),
                used.map(|u| u <= 1.0),
            );
        }
        let deep = self.num("drain_4_1m");
        let deep_label = match &self.drain_deep {
            Some(r) => format!("drain_4_1m (1 000 000 items, {} workers)", r.workers),
            None => "drain_4_1m (1 000 000 items)".to_owned(),
        };
        push(
            &deep_label,
            deep,
            "/s",
            ">= 65 000/s, no slowdown".into(),
            deep.map(|v| v >= DRAIN_TARGET),
        );
        push(
            &format!(
                "small_claims_drain (2 workers × {SMALL_CLAIMS_CONCURRENCY} handlers, {} items)",
                self.small_claims
                    .as_ref()
                    .map_or(String::new(), |r| group(r.items as f64))
            ),
            self.num("small_claims_drain"),
            "/s",
            String::new(),
            None,
        );
        let flat = self.num("small_claims_late_over_early");
        push(
            "small_claims_late_over_early (tenths 8–10 / 2–4)",
            flat,
            "",
            ">= 0.90 (no slowdown)".into(),
            flat.map(|r| r >= SMALL_CLAIMS_FLAT_TARGET),
        );
        push(
            "small_claims_items_per_claim",
            self.num("small_claims_items_per_claim"),
            "",
            String::new(),
            None,
        );
        push(
            "small_claims_claim_ms (claim_work's database time a call)",
            self.num("small_claims_claim_ms"),
            "ms",
            String::new(),
            None,
        );
        push(
            "enqueue_single_1",
            self.num("enqueue_single_1"),
            "/s",
            String::new(),
            None,
        );
        push(
            "enqueue_single_16",
            self.num("enqueue_single_16"),
            "/s",
            String::new(),
            None,
        );
        push(
            "enqueue_single_16_wakes_per_item (wake statements, shared)",
            self.num("enqueue_single_16_wakes_per_item"),
            "",
            String::new(),
            None,
        );
        push(
            "enqueue_tx_16_notify (16 producers' transactions, wake in the commit)",
            self.num("enqueue_tx_16_notify"),
            "/s",
            String::new(),
            None,
        );
        push(
            "enqueue_tx_16_deferred (the same, wake after the commit)",
            self.num("enqueue_tx_16_deferred"),
            "/s",
            String::new(),
            None,
        );
        push(
            "enqueue_tx_16_deferred_wakes_per_item (wake statements, shared)",
            self.num("enqueue_tx_16_deferred_wakes_per_item"),
            "",
            String::new(),
            None,
        );
        push(
            "enqueue_single_1_no_ping (pool not pinging)",
            self.num("enqueue_single_1_no_ping"),
            "/s",
            String::new(),
            None,
        );
        let ops_items = self.num("ops_items").map_or(String::new(), group);
        for (figure, label) in [
            ("ops_page_100_ms", "a page of 100 items"),
            ("ops_page_100_dead_ms", "a page of 100 dead letters"),
            ("ops_queue_overview_ms", "the queue overview"),
        ] {
            let v = self.num(figure);
            push(
                &format!("{figure} ({label}, {ops_items} items)"),
                v,
                "ms",
                "<= 50 ms".into(),
                v.map(|v| v <= OPS_READ_TARGET_MS),
            );
        }
        let beside = self.num("drain_with_dashboard_ratio");
        push(
            "drain_with_dashboard_ratio (beside / alone, median of pairs)",
            beside,
            "",
            ">= 0.97".into(),
            beside.map(|r| r >= DASHBOARD_RATIO_TARGET),
        );
        let bulk = self.num("enqueue_bulk");
        push(
            &format!("enqueue_bulk (batches of {BULK_BATCH})"),
            bulk,
            "/s",
            ">= 150 000/s".into(),
            bulk.map(|v| v >= BULK_TARGET),
        );
        push(
            "enqueue_bulk_wal_bytes_per_item",
            self.num("enqueue_bulk_wal_bytes_per_item"),
            "B",
            String::new(),
            None,
        );
        let p50 = self.num("pickup_p50_ms");
        push(
            "pickup_p50_ms",
            p50,
            "ms",
            "<= 1.5 ms".into(),
            p50.map(|v| v <= PICKUP_P50_TARGET),
        );
        push(
            "pickup_p90_ms",
            self.num("pickup_p90_ms"),
            "ms",
            String::new(),
            None,
        );
        let p99 = self.num("pickup_p99_ms");
        push(
            "pickup_p99_ms",
            p99,
            "ms",
            "<= 3 ms".into(),
            p99.map(|v| v <= PICKUP_P99_TARGET),
        );
        push(
            "pickup_max_ms",
            self.num("pickup_max_ms"),
            "ms",
            String::new(),
            None,
        );
        for figure in [
            "pickup_async_p50_ms",
            "pickup_async_p99_ms",
            "pickup_async_max_ms",
        ] {
            push(
                &format!("{figure} (queues.<q>.async_commit)"),
                self.num(figure),
                "ms",
                String::new(),
                None,
            );
        }
        for r in &self.renewals {
            let suffix = if r.warm_stats { "_warm_stats" } else { "" };
            let interval_s = LEASE_MS as f64 / 3.0 / 1_000.0;
            let allowed = r.in_flight as f64 / RENEW_ITEMS_PER_STATEMENT * 60.0 / interval_s;
            let expected = r.in_flight as f64 * 60.0 / interval_s;
            // Statement efficiency only counts when every lease was actually renewed.
            let held = r.renew_rows_per_min >= 0.95 * expected;
            push(
                &format!("renew_statements_per_min{suffix}"),
                Some(r.renew_statements_per_min.round()),
                "/min",
                format!("<= {} (1 per 200 per interval)", group(allowed)),
                Some(r.renew_statements_per_min <= allowed * 1.02 && held),
            );
            push(
                &format!("renew_rows_per_min{suffix}"),
                Some(r.renew_rows_per_min.round()),
                "/min",
                format!("~{} (each item each interval)", group(expected)),
                Some(held),
            );
            push(
                &format!("renew_failed_items_per_min{suffix}"),
                Some(r.failed_items_per_min.round()),
                "/min",
                "0 (no lease may lapse)".into(),
                Some(r.failed_items_per_min == 0.0),
            );
            push(
                &format!("renew_lost_before_window{suffix}"),
                Some(r.lost_before_window as f64),
                "items",
                "0 (none lost in the claims or the settling)".into(),
                Some(r.lost_before_window == 0),
            );
            let window_beats = (r.window_s / HEARTBEAT_SLOW_S).ceil();
            push(
                &format!("heartbeat_statements_per_min{suffix}"),
                Some(round2(r.heartbeat_statements_per_min)),
                "/min",
                "1 per 60 s (lock held)".into(),
                Some(r.heartbeat_statements_per_min * r.window_s / 60.0 <= window_beats + 0.01),
            );
            push(
                &format!("rss_mb_10k_inflight{suffix} (peak)"),
                Some(round2(r.rss_peak_mb)),
                "MB",
                "<= 100 MB".into(),
                Some(r.rss_peak_mb <= RSS_TARGET),
            );
        }
        let f = self.num("failover_median_s");
        push(
            "failover_median_s (defaults)",
            f,
            "s",
            "<= 5 s".into(),
            f.map(|v| v <= FAILOVER_TARGET),
        );
        let f = self.num("failover_short_median_s");
        push(
            "failover_short_median_s (short liveness)",
            f,
            "s",
            "<= 5 s".into(),
            f.map(|v| v <= FAILOVER_TARGET),
        );
        let up = self.num("idle_statements_per_s_per_instance_listener_up");
        push(
            "idle_statements_per_s_listener_up (4)",
            self.num("idle_statements_per_s_listener_up"),
            "/s",
            "<= 4 /s (1 per instance)".into(),
            up.map(|v| v <= IDLE_TARGET),
        );
        push(
            "idle_statements_per_s_listener_down (4)",
            self.num("idle_statements_per_s_listener_down"),
            "/s",
            String::new(),
            None,
        );
        push(
            &format!("upkeep_ms_per_s ({UPKEEP_INSTANCES} instances' sweeps, in turns)"),
            self.num("upkeep_ms_per_s"),
            "ms/s",
            String::new(),
            None,
        );
        push(
            "upkeep_every_call_ms_per_s (every call taking its turn)",
            self.num("upkeep_every_call_ms_per_s"),
            "ms/s",
            String::new(),
            None,
        );
        for n in super::ceiling::CLIENTS {
            push(
                &format!("ceiling_single_{n}"),
                self.num(&format!("ceiling_single_{n}")),
                "rows/s",
                String::new(),
                None,
            );
        }
        for n in super::ceiling::CLIENTS {
            push(
                &format!("ceiling_batch100_{n}"),
                self.num(&format!("ceiling_batch100_{n}")),
                "rows/s",
                String::new(),
                None,
            );
        }
        push(
            "ceiling_batch100 (best)",
            ceiling,
            "rows/s",
            String::new(),
            None,
        );
        push(
            "ceiling_two_step100 (best, informative)",
            self.num("ceiling_two_step100"),
            "rows/s",
            String::new(),
            None,
        );
        push(
            "drain_over_ceiling (best drain)",
            self.num("drain_over_ceiling"),
            "",
            ">= 0.70".into(),
            self.num("drain_over_ceiling")
                .map(|r| r >= DRAIN_CEILING_TARGET),
        );
        rows
    }

    fn details_text(&self, out: &mut String) {
        if !self.drains.is_empty() || self.drain_deep.is_some() || self.small_claims.is_some() {
            let _ = writeln!(out, "\ndrain runs");
            let all = self
                .drains
                .iter()
                .flat_map(|(_, runs)| runs.iter())
                .chain(self.drain_deep.iter())
                .chain(self.small_claims.iter())
                .map(|r| (r.workers.to_string(), r));
            drain_runs_table(out, "workers", all);
            if let Some(rates) = self
                .drain_deep
                .as_ref()
                .and_then(|r| r.decile_rates.clone())
            {
                let shown: Vec<String> = rates.iter().map(|r| group(*r)).collect();
                let _ = writeln!(
                    out,
                    "  1M drain, items/s per tenth of the items: {}",
                    shown.join(", ")
                );
            }
            if let Some(rates) = self
                .small_claims
                .as_ref()
                .and_then(|r| r.decile_rates.clone())
            {
                let shown: Vec<String> = rates.iter().map(|r| group(*r)).collect();
                let _ = writeln!(
                    out,
                    "  small-claims drain, items/s per tenth of the items: {}",
                    shown.join(", ")
                );
            }
            // Where the database time went in the last run with the most workers.
            let last = self
                .drains
                .iter()
                .max_by_key(|(n, _)| *n)
                .and_then(|(_, runs)| runs.last());
            if let Some(r) = last {
                if !r.statements.is_empty() {
                    let _ = writeln!(
                        out,
                        "\nwhere the drain's database time went ({} workers, {} items, last run)",
                        r.workers,
                        group(r.items as f64)
                    );
                    statement_table(out, &r.statements, r.items);
                }
            }
        }
        if let Some(k) = &self.keyed {
            let _ = writeln!(
                out,
                "\nordering keys, {} workers: plain and keyed drains alternated (pair ratios {}), then one hot key",
                k.workers,
                k.pairs
                    .ratios()
                    .iter()
                    .map(|r| format!("{r:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let runs = k
                .pairs
                .base
                .iter()
                .map(|r| ("plain", r))
                .chain(k.pairs.variant.iter().map(|r| ("keyed", r)))
                .chain(k.hot.iter().map(|r| ("hot key", r)))
                .map(|(label, r)| (label.to_owned(), r));
            drain_runs_table(out, "drain", runs);
            let _ = writeln!(
                out,
                "  enqueue (bulk, 10 000 a call), median: plain {} items/s, keyed {} items/s",
                group(Keyed::enqueue_median(&k.pairs.base)),
                group(Keyed::enqueue_median(&k.pairs.variant))
            );
            for (label, r) in k
                .pairs
                .variant
                .iter()
                .map(|r| ("keyed", r))
                .chain(k.hot.iter().map(|r| ("hot key", r)))
            {
                if let Some(g) = &r.key_gaps {
                    let _ = writeln!(
                        out,
                        "  {label}: completion of an item to the next of its key: p50 {} ms, p90 {} ms, max {} ms ({} gaps)",
                        g.p50_ms, g.p90_ms, g.max_ms, group(g.gaps as f64)
                    );
                }
            }
            if let Some(r) = k.pairs.variant.last() {
                if !r.statements.is_empty() {
                    let _ = writeln!(
                        out,
                        "\nwhere the keyed drain's database time went ({} workers, {} items, last run)",
                        r.workers,
                        group(r.items as f64)
                    );
                    statement_table(out, &r.statements, r.items);
                }
            }
            if let Some(r) = k.hot.last() {
                if !r.statements.is_empty() {
                    let _ = writeln!(
                        out,
                        "\nwhere the hot key's database time went ({} workers, {} items, last run)",
                        r.workers,
                        group(r.items as f64)
                    );
                    statement_table(out, &r.statements, r.items);
                }
            }
        }
        if let Some(f) = &self.fleet_limit {
            for (label, pairs, what) in [
                (
                    "bound",
                    &f.bound,
                    format!(
                        "{} ms items, the drain's handlers a worker",
                        flow::BOUND_HANDLER_MS
                    ),
                ),
                (
                    "free",
                    &f.free,
                    format!("no-op items, {} handlers a worker", f.free_concurrency),
                ),
            ] {
                let _ = writeln!(
                    out,
                    "\nfleet limit {}, {label} ({what}), {} workers: unlimited and limited drains alternated (pair ratios {})",
                    flow::FLEET_LIMIT,
                    f.workers,
                    pairs
                        .ratios()
                        .iter()
                        .map(|r| format!("{r:.3}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                let runs: Vec<(String, &DrainRun)> = pairs
                    .base
                    .iter()
                    .map(|r| ("no limit", r))
                    .chain(pairs.variant.iter().map(|r| ("limit", r)))
                    .map(|(label, r)| (label.to_owned(), r))
                    .collect();
                drain_runs_table(out, "drain", runs.iter().cloned());
                for (label, r) in runs {
                    if let Some(s) = &r.running {
                        let _ = writeln!(
                            out,
                            "  {label}: running sampled {} times: max {}, p50 {}, {:.1} % of the samples below {}",
                            group(s.samples as f64),
                            s.max,
                            s.p50,
                            100.0 * s.share_below(),
                            s.threshold
                        );
                    }
                }
            }
            if let Some(r) = f.free.variant.last() {
                if !r.statements.is_empty() {
                    let _ = writeln!(
                        out,
                        "\nwhere the limited free drain's database time went ({} workers, {} items, last run)",
                        r.workers,
                        group(r.items as f64)
                    );
                    statement_table(out, &r.statements, r.items);
                }
            }
        }
        if let Some(rate) = &self.rate {
            let _ = writeln!(
                out,
                "\nrate limit {} per {} ms, {} workers at the drain's concurrency; starts counted by completion time from 1 s after the resume",
                group(f64::from(flow::RATE)),
                flow::RATE_PERIOD.as_millis(),
                rate.workers
            );
            for r in &rate.runs {
                if let Some(w) = &r.rate_window {
                    let _ = writeln!(
                        out,
                        "  {} items: {:.1} starts/s over {:.0} s ({:+.2} %); first second {}; {} by the window's end, the bucket allows {:.0}; per second {}–{}",
                        group(r.items as f64),
                        w.per_s,
                        w.window_s,
                        100.0 * w.deviation,
                        group(w.first_period as f64),
                        group(w.by_end as f64),
                        w.allowed_by_end.floor(),
                        w.second_min,
                        w.second_max
                    );
                }
            }
        }
        if !self.ceiling.is_empty() {
            let _ = writeln!(out, "\nceiling runs (pgbench, rows/s)");
            let _ = writeln!(
                out,
                "  {:<12} {:>10} {:>10} {:>10} {:>10}",
                "script", "1", "4", "8", "16"
            );
            for script in ["single", "batch100", "two_step100"] {
                let cells: Vec<String> = super::ceiling::CLIENTS
                    .iter()
                    .map(|n| {
                        self.ceiling
                            .iter()
                            .find(|r| r.script == script && r.clients == *n)
                            .map_or("-".to_owned(), |r| group(r.rows_per_s))
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "  {:<12} {:>10} {:>10} {:>10} {:>10}",
                    script, cells[0], cells[1], cells[2], cells[3]
                );
            }
        }
        if let Some(p) = &self.pickup {
            let _ = writeln!(
                out,
                "\npickup: {} probes; upper bound (from sending the enqueue) p50 {} ms, p99 {} ms; enqueue round trip p50 {} ms; database clock, enqueue start to completion start p50 {} ms, p99 {} ms; per statement meanwhile:",
                p.samples, p.upper_p50, p.upper_p99, p.enqueue_rtt_p50, p.db_enqueue_to_complete_p50, p.db_enqueue_to_complete_p99
            );
            let _ = writeln!(
                out,
                "  {:<28} {:>8} {:>10}",
                "statement", "calls", "mean ms"
            );
            for s in p.statements.iter().take(8) {
                let _ = writeln!(
                    out,
                    "  {:<28} {:>8} {:>10.3}",
                    setup::short_name(&s.query),
                    s.calls,
                    s.total_ms / s.calls.max(1) as f64
                );
            }
        }
        for r in &self.renewals {
            let _ = writeln!(
                out,
                "\nrenewal, {}: {} in flight, lease {} ms, window {:.1} s; worker RSS {:.1} MB ready, {:.1} MB now, {:.1} MB peak; worker CPU {:.2} s/s; {:.0} WAL bytes per renewed row",
                if r.warm_stats {
                    "work table analyzed with the items running"
                } else {
                    "statistics of the idle queue (analyzed before the claims)"
                },
                r.in_flight, LEASE_MS, r.window_s, r.rss_idle_mb, r.rss_mb, r.rss_peak_mb, r.worker_cpu_per_s,
                r.wal_bytes_per_renewal
            );
            let _ = writeln!(
                out,
                "  cross-check, pg_stat_user_functions: renew_leases {:.0}/min, record_heartbeat {:.2}/min",
                r.renew_function_calls_per_min, r.heartbeat_function_calls_per_min
            );
            per_minute_table(out, &r.statements, r.window_s);
        }
        for idle in &self.idles {
            let _ = writeln!(
                out,
                "\nidle, listener {}: {:.2} statements/s from {} workers ({:.2} per instance; xact_commit {:.2}/s); per statement, calls in {:.1} s:",
                if idle.listener { "up" } else { "down" },
                idle.statements_per_s,
                IDLE_WORKERS,
                idle.statements_per_s / IDLE_WORKERS as f64,
                idle.xact_commit_per_s,
                idle.window_s
            );
            for s in &idle.statements {
                let _ = writeln!(out, "  {:>6}  {}", s.calls, setup::short_name(&s.query));
            }
        }
        if let Some(u) = &self.upkeep {
            let _ = writeln!(
                out,
                "\nupkeep: the sweeps of {UPKEEP_INSTANCES} instances over {} available and {} keyed items (server ms in each window):",
                group(u.available as f64),
                group(u.keyed as f64),
            );
            for side in [&u.every_call, &u.turns] {
                let shown: Vec<String> = side
                    .statements
                    .iter()
                    .map(|(name, calls, ms)| format!("{name} {calls} calls {ms:.0} ms"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  {:<11} {:>8.1} ms/s over {:.1} s: {}",
                    if side.turns { "in turns" } else { "every call" },
                    side.ms_per_s,
                    side.window_s,
                    shown.join(", ")
                );
            }
        }
        for (short, runs) in &self.failovers {
            let shown: Vec<String> = runs
                .iter()
                .map(|r| {
                    format!(
                        "{:.2} s (kill phase {:.2} s, reaped {})",
                        r.total_s,
                        r.kill_phase_s,
                        r.reaped_s
                            .map_or("never".to_owned(), |s| format!("{s:.2} s"))
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "\nfailover, {}: {}",
                if *short {
                    "short liveness settings"
                } else {
                    "defaults"
                },
                shown.join("; ")
            );
        }
    }
}

/// One line per drain run, labelled (the worker count, or the kind of drain).
fn drain_runs_table<'a>(
    out: &mut String,
    label: &str,
    runs: impl Iterator<Item = (String, &'a DrainRun)>,
) {
    let _ = writeln!(
        out,
        "  {:>7} {:>9} {:>9} {:>8} {:>8} {:>10} {:>12} {:>12} {:>10}",
        label,
        "items",
        "items/s",
        "seconds",
        "startup",
        "WAL B/item",
        "server µs/it",
        "worker µs/it",
        "other CPU"
    );
    for (label, r) in runs {
        let per_item = |s: f64| format!("{:.0}", s * 1e6 / r.items as f64);
        let _ = writeln!(
            out,
            "  {:>7} {:>9} {:>9} {:>7.2}s {:>7.2}s {:>10.0} {:>12} {:>12} {:>10}",
            label,
            group(r.items as f64),
            group(r.rate),
            r.seconds,
            r.startup_s,
            r.wal_bytes_per_item,
            r.server_cpu_s.map_or("-".to_owned(), per_item),
            per_item(r.worker_cpu_s),
            r.other_cpu_s.map_or("-".to_owned(), |s| format!("{s:.2}s"))
        );
    }
}

fn statement_table(out: &mut String, stmts: &[setup::Statement], items: usize) {
    let total: f64 = stmts.iter().map(|s| s.total_ms).sum();
    let _ = writeln!(
        out,
        "  {:<28} {:>8} {:>10} {:>11} {:>9} {:>7} {:>11}",
        "statement", "calls", "rows", "total ms", "mean ms", "share", "µs/item"
    );
    for s in stmts.iter().take(10) {
        let _ = writeln!(
            out,
            "  {:<28} {:>8} {:>10} {:>11.1} {:>9.3} {:>6.1}% {:>11.2}",
            setup::short_name(&s.query),
            s.calls,
            s.rows,
            s.total_ms,
            s.total_ms / s.calls.max(1) as f64,
            100.0 * s.total_ms / total.max(1e-9),
            1_000.0 * s.total_ms / items.max(1) as f64
        );
    }
}

fn per_minute_table(out: &mut String, stmts: &[setup::Statement], window_s: f64) {
    let _ = writeln!(
        out,
        "  {:<28} {:>10} {:>12} {:>10}",
        "statement", "calls/min", "rows/min", "mean ms"
    );
    for s in stmts.iter().take(8) {
        let _ = writeln!(
            out,
            "  {:<28} {:>10.1} {:>12.0} {:>10.3}",
            setup::short_name(&s.query),
            s.calls as f64 * 60.0 / window_s,
            s.rows as f64 * 60.0 / window_s,
            s.total_ms / s.calls.max(1) as f64
        );
    }
}

/// `1234567.8` → `1 234 568`.
fn group(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn round3(v: f64) -> f64 {
    (v * 1_000.0).round() / 1_000.0
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The commit the bench ran on, and how many files differed from it.
fn git_state() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .map_or(0, |s| s.lines().count());
            if dirty == 0 {
                head.trim().to_owned()
            } else {
                format!("{} with {dirty} changed files", head.trim())
            }
        }
        None => "unknown (no git)".to_owned(),
    }
}

fn mem_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let kb: f64 = t
                .lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_default()
}
