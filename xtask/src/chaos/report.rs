//! The suite's output: a line per scenario as it ends, the table, the violations with their
//! evidence, and the same as JSON (`--json PATH`).

use std::time::Duration;

use serde_json::{json, Value};

use super::Options;
use crate::harness::check::Verdict;

/// Violation details printed per scenario (the JSON keeps up to [`JSON_DETAILS`]).
const PRINTED_DETAILS: usize = 8;
const JSON_DETAILS: usize = 100;

/// One measured recovery.
pub(crate) struct Recovery {
    pub(crate) label: String,
    /// None: not measured (nothing to recover, or it never happened — see the detail).
    pub(crate) seconds: Option<f64>,
    pub(crate) bound: f64,
    pub(crate) bound_why: String,
    pub(crate) detail: String,
}

/// One scenario's result.
pub(crate) struct Report {
    pub(crate) name: &'static str,
    pub(crate) seed: u64,
    pub(crate) profile: &'static str,
    pub(crate) items: usize,
    pub(crate) workers: usize,
    pub(crate) duration_s: f64,
    pub(crate) completed: usize,
    pub(crate) dead: usize,
    pub(crate) cancelled: usize,
    pub(crate) lost: usize,
    pub(crate) double: usize,
    pub(crate) effects: usize,
    pub(crate) history: usize,
    /// Writes the fence should have refused, or that nobody asked for.
    pub(crate) fence: usize,
    pub(crate) reclaims: usize,
    pub(crate) lapsed: usize,
    /// Every eviction the store recorded.
    pub(crate) evictions: usize,
    /// Those that were violations (a live instance, a self-reap, ...).
    pub(crate) bad_evictions: usize,
    /// The invariant violations, each with its evidence.
    pub(crate) details: Vec<String>,
    /// The scenario's own violations (recovery over bound, live eviction, lost leases...).
    pub(crate) violations: Vec<String>,
    pub(crate) recovery: Vec<Recovery>,
    pub(crate) notes: Vec<String>,
    pub(crate) skipped: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) logs: String,
}

impl Report {
    pub(crate) fn new(name: &'static str, profile: &'static str, seed: u64) -> Report {
        Report {
            name,
            seed,
            profile,
            items: 0,
            workers: 0,
            duration_s: 0.0,
            completed: 0,
            dead: 0,
            cancelled: 0,
            lost: 0,
            double: 0,
            effects: 0,
            history: 0,
            fence: 0,
            reclaims: 0,
            lapsed: 0,
            evictions: 0,
            bad_evictions: 0,
            details: Vec::new(),
            violations: Vec::new(),
            recovery: Vec::new(),
            notes: Vec::new(),
            skipped: None,
            error: None,
            logs: String::new(),
        }
    }

    pub(crate) fn set_verdict(&mut self, v: &Verdict) {
        self.completed = v.completed;
        self.dead = v.dead;
        self.cancelled = v.cancelled;
        self.lost = v.lost.len();
        self.double = v.double.len();
        self.effects = v.effects.len();
        self.history = v.history.len();
        self.fence = v.fence.len();
    }

    /// Whether the scenario ran and found nothing wrong. A skipped scenario did not pass: a
    /// run that is meant to leave one out says so on the command line (`--exclude`).
    pub(crate) fn passed(&self) -> bool {
        self.skipped.is_none()
            && self.error.is_none()
            && self.lost + self.double + self.effects + self.history + self.fence == 0
            && self.violations.is_empty()
    }

    fn result(&self) -> &'static str {
        if self.skipped.is_some() {
            "SKIP"
        } else if self.passed() {
            "PASS"
        } else {
            "FAIL"
        }
    }

    /// The worst recovery, as the table shows it.
    fn recovery_cell(&self) -> String {
        let worst = self
            .recovery
            .iter()
            .filter_map(|r| r.seconds.map(|s| (s, r.bound)))
            .fold(None, |m: Option<(f64, f64)>, (s, b)| match m {
                Some((ms, _)) if ms >= s => m,
                _ => Some((s, b)),
            });
        match worst {
            Some((s, b)) => format!("{s:.1} s (≤{b:.0})"),
            None if self.recovery.is_empty() => "-".into(),
            None => "n/a".into(),
        }
    }
}

/// The line printed when a scenario ends.
pub(crate) fn print_row_summary(r: &Report) {
    for rec in &r.recovery {
        println!(
            "   recovery  {}: {} (bound {:.1} s: {}); {}",
            rec.label,
            rec.seconds
                .map(|s| format!("{s:.2} s"))
                .unwrap_or_else(|| "not measured".into()),
            rec.bound,
            rec.bound_why,
            rec.detail
        );
    }
    for note in &r.notes {
        println!("   note      {note}");
    }
    if let Some(skip) = &r.skipped {
        println!("   SKIP      {skip}\n");
        return;
    }
    if let Some(e) = &r.error {
        println!("   error     {e}");
    }
    println!(
        "   {}      {} items: {} completed, {} dead, {} cancelled; lost {}, double outcomes {}, \
         effects mismatches {}, history mismatches {}, fence violations {}, evictions {} ({} \
         wrong), other violations {} ({:.0} s)\n",
        r.result(),
        r.items,
        r.completed,
        r.dead,
        r.cancelled,
        r.lost,
        r.double,
        r.effects,
        r.history,
        r.fence,
        r.evictions,
        r.bad_evictions,
        r.violations.len(),
        r.duration_s
    );
}

/// The table of every scenario.
pub(crate) fn print_table(reports: &[Report]) {
    println!(
        "{:<17} {:<8} {:>5} {:>5} {:>6} {:>6} {:>7} {:>5} {:>7} {:>5} {:>8} {:>5} {:<15} {:>5} {:<4}",
        "scenario",
        "settings",
        "items",
        "lost",
        "double",
        "effect",
        "history",
        "fence",
        "reclaim",
        "evict",
        "other",
        "secs",
        "recovery",
        "wrkrs",
        "result"
    );
    for r in reports {
        println!(
            "{:<17} {:<8} {:>5} {:>5} {:>6} {:>6} {:>7} {:>5} {:>7} {:>5} {:>8} {:>5.0} {:<15} {:>5} {:<4}",
            r.name,
            r.profile,
            r.items,
            r.lost,
            r.double,
            r.effects,
            r.history,
            r.fence,
            r.reclaims,
            format!("{}/{}", r.bad_evictions, r.evictions),
            r.violations.len(),
            r.duration_s,
            r.recovery_cell(),
            r.workers,
            r.result()
        );
    }
}

/// Every violation, with its evidence.
pub(crate) fn print_violations(reports: &[Report]) {
    for r in reports.iter().filter(|r| !r.passed()) {
        println!(
            "\n{} ({} settings) — {} (seed {}; logs {})",
            r.name,
            r.profile,
            if r.skipped.is_some() {
                "SKIPPED, which counts as not passed"
            } else {
                "FAILED"
            },
            r.seed,
            r.logs
        );
        if let Some(skip) = &r.skipped {
            println!("  skipped: {skip}");
        }
        if let Some(e) = &r.error {
            println!("  error: {e}");
        }
        for v in &r.violations {
            println!("  violation: {v}");
        }
        for d in r.details.iter().take(PRINTED_DETAILS) {
            println!("  {d}");
        }
        if r.details.len() > PRINTED_DETAILS {
            println!(
                "  ... and {} more (all in --json)",
                r.details.len() - PRINTED_DETAILS
            );
        }
    }
}

pub(crate) fn to_json(
    reports: &[Report],
    options: &Options,
    took: Duration,
    build: Duration,
) -> Value {
    json!({
        "mode": if options.quick { "quick" } else { "full" },
        "seed": options.seed,
        "passed": reports.iter().all(Report::passed),
        "seconds": took.as_secs_f64(),
        "build_seconds": build.as_secs_f64(),
        "scenarios": reports.iter().map(|r| json!({
            "name": r.name,
            "seed": r.seed,
            "settings": r.profile,
            "result": r.result(),
            "items": r.items,
            "workers": r.workers,
            "seconds": r.duration_s,
            "completed": r.completed,
            "dead": r.dead,
            "cancelled": r.cancelled,
            "lost": r.lost,
            "double_outcomes": r.double,
            "effects_mismatch": r.effects,
            "history_mismatch": r.history,
            "fence_violations": r.fence,
            "reclaims": r.reclaims,
            "lapsed_leases": r.lapsed,
            "evictions": r.evictions,
            "wrong_evictions": r.bad_evictions,
            "recovery": r.recovery.iter().map(|rec| json!({
                "fault": rec.label,
                "seconds": rec.seconds,
                "bound_seconds": rec.bound,
                "bound": rec.bound_why,
                "detail": rec.detail,
            })).collect::<Vec<_>>(),
            "violations": r.violations,
            "details": r.details.iter().take(JSON_DETAILS).collect::<Vec<_>>(),
            "notes": r.notes,
            "skipped": r.skipped,
            "error": r.error,
            "logs": r.logs,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_scenario_did_not_pass() {
        let mut r = Report::new("clock-skew", "short", 1);
        assert!(r.passed());
        r.skipped = Some("libfaketime is missing".into());
        assert!(!r.passed());
        assert_eq!(r.result(), "SKIP");
    }

    #[test]
    fn a_fence_violation_fails_the_scenario() {
        let mut r = Report::new("sigkill", "short", 1);
        r.fence = 1;
        assert!(!r.passed());
    }
}
