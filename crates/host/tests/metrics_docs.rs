//! docs/metrics.md is the metrics reference: it must list exactly the metrics the crates
//! describe, with the same type, unit and crate; and every metric the Grafana dashboard and
//! the Prometheus rules in monitoring/ query must be listed there, so renaming a metric breaks
//! the build rather than the dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use workpump_host::metrics::{catalog, MetricKind};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// One row of the docs table: (type, unit, crate).
type Row = (String, String, String);

/// The rows of the table in docs/metrics.md, by metric name.
fn documented() -> BTreeMap<String, Row> {
    let text = read("docs/metrics.md");
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `workpump_")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 6, "docs/metrics.md: six cells in {line:?}");
        let name = cells[0].trim_matches('`').to_owned();
        let row = (
            cells[1].to_owned(),
            cells[2].to_owned(),
            cells[4].to_owned(),
        );
        assert!(
            rows.insert(name.clone(), row).is_none(),
            "docs/metrics.md lists {name} twice"
        );
    }
    rows
}

#[test]
fn docs_metrics_md_lists_exactly_the_described_metrics_with_their_type_unit_and_crate() {
    let described: BTreeMap<String, Row> = catalog()
        .into_iter()
        .map(|m| {
            let row = (
                m.kind.as_str().to_owned(),
                m.unit.unwrap_or("-").to_owned(),
                m.package.to_owned(),
            );
            (m.name, row)
        })
        .collect();
    let documented = documented();
    assert!(described.len() >= 45, "{} described", described.len());

    let mut problems = Vec::new();
    for (name, row) in &described {
        match documented.get(name) {
            None => problems.push(format!(
                "{name} is described by {} but missing from docs/metrics.md",
                row.2
            )),
            Some(doc) if doc != row => problems.push(format!(
                "{name}: docs/metrics.md says (type, unit, crate) = {doc:?}, the code {row:?}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !described.contains_key(name) {
            problems.push(format!(
                "{name} is in docs/metrics.md but no crate describes it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_metric_is_described_once_with_a_help_text() {
    let mut seen = BTreeSet::new();
    for m in catalog() {
        assert!(seen.insert(m.name.clone()), "{} is described twice", m.name);
        assert!(!m.help.trim().is_empty(), "{} has no help text", m.name);
        assert!(m.name.starts_with("workpump_"), "{}", m.name);
        if m.kind == MetricKind::Counter {
            assert!(
                m.name.ends_with("_total"),
                "a counter ends in _total: {}",
                m.name
            );
        }
        if m.name.ends_with("_seconds") {
            assert_eq!(m.unit, Some("seconds"), "{}", m.name);
        }
    }
}

/// Every `workpump_...` name in `text`, with a histogram's `_bucket`, `_sum` or `_count`
/// suffix taken off when the rest is a documented histogram.
fn metric_names(text: &str, documented: &BTreeMap<String, Row>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("workpump_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                (documented.get(base)?.0 == "histogram").then_some(base)
            })
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[end..];
    }
    names
}

/// The PromQL expressions of the dashboard: every `expr` of every panel's targets.
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("monitoring/grafana/workpump.json"))
            .expect("monitoring/grafana/workpump.json is JSON");
    let mut exprs = Vec::new();
    walk(&dashboard, &mut exprs);
    exprs
}

#[test]
fn every_metric_the_dashboard_and_the_alert_rules_query_is_documented() {
    let documented = documented();
    let exprs = dashboard_exprs();
    let dashboard = metric_names(&exprs.join("\n"), &documented);
    let rules = metric_names(
        &read("monitoring/prometheus/workpump.rules.yml"),
        &documented,
    );
    let tests = metric_names(
        &read("monitoring/prometheus/workpump.rules.test.yml"),
        &documented,
    );
    assert!(dashboard.len() >= 15, "the dashboard queries {dashboard:?}");
    assert!(rules.len() >= 5, "the rules query {rules:?}");
    let mut unknown = Vec::new();
    for (file, names) in [
        ("monitoring/grafana/workpump.json", &dashboard),
        ("monitoring/prometheus/workpump.rules.yml", &rules),
        ("monitoring/prometheus/workpump.rules.test.yml", &tests),
    ] {
        for name in names.iter().filter(|n| !documented.contains_key(*n)) {
            unknown.push(format!(
                "{file} queries {name}, which docs/metrics.md does not list"
            ));
        }
    }
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}

#[test]
fn the_dashboard_shows_what_an_operator_watches() {
    let documented = documented();
    let exprs = dashboard_exprs().join("\n");
    let shown = metric_names(&exprs, &documented);
    for (what, metric) in [
        ("throughput", "workpump_items_total"),
        ("pickup lag", "workpump_pickup_lag_seconds"),
        ("pickup lag, sampled", "workpump_queue_pickup_lag_seconds"),
        ("in flight", "workpump_in_flight"),
        ("failures", "workpump_handler_duration_seconds"),
        (
            "dead letters",
            "workpump_maintenance_dead_lettered_items_total",
        ),
        (
            "dead letters a claim made",
            "workpump_claim_orphans_ended_total",
        ),
        ("renewals", "workpump_lease_renewals_total"),
        ("renewal calls", "workpump_lease_renewal_calls_total"),
        ("heartbeats", "workpump_heartbeats_total"),
        ("live instances", "workpump_host_up"),
        ("worker restarts", "workpump_worker_restarts_total"),
        ("queue depth", "workpump_queue_depth"),
    ] {
        assert!(
            shown.contains(metric),
            "the dashboard shows {what} ({metric})"
        );
    }
    let rules = read("monitoring/prometheus/workpump.rules.yml");
    for alert in [
        "WorkpumpPickupLagHigh",
        "WorkpumpDeadLettersGrowing",
        "WorkpumpNoLiveInstance",
        "WorkpumpLeaseRenewalsFailing",
        "WorkpumpWorkerRestarting",
    ] {
        assert!(
            rules.contains(&format!("alert: {alert}\n")),
            "the rules define {alert}"
        );
        let tests = read("monitoring/prometheus/workpump.rules.test.yml");
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "the rule tests exercise {alert}"
        );
    }
}

#[test]
fn the_dashboard_panels_have_unique_ids_do_not_overlap_and_each_queries_the_chosen_data_source() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("monitoring/grafana/workpump.json")).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 20, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for p in panels {
        let title = p["title"].as_str().expect("a title").to_owned();
        assert!(
            ids.insert(p["id"].as_u64().expect("an id")),
            "id of {title}"
        );
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().expect("gridPos"));
        assert!(x + w <= 24, "{title} fits the 24 columns");
        for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
            if let Some(other) = cells.insert(cell, title.clone()) {
                panic!("{title} overlaps {other}");
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} queries something");
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| e.contains("workpump_")),
                "{title}: {t}"
            );
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "queue"]);
}
