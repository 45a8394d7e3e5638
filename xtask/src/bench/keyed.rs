//! Ordering keys (issue 15; docs/ordering.md, "The cost"): a drain of 100 000 items over
//! 10 000 keys (10 a key) against the plain drain of the same items, the two run alternately
//! in pairs ([`Pairs`]), and one hot key: 3 000 items of a single key, which run one at a time
//! by design, so its rate is the promotion path's round trip per item.

use serde_json::json;

use super::drain::{self, DrainRun, Pairs, Shape};
use super::{BenchResult, Ctx};

/// Items of the keyed drain (and of the plain drain it is compared with), whatever `--items`.
pub(crate) const ITEMS: usize = 100_000;
/// The keyed drain's ordering keys.
pub(crate) const KEYS: usize = 10_000;
/// Items of the hot key.
pub(crate) const HOT_KEY_ITEMS: usize = 3_000;

/// The keyed drains, the plain drains paired with them, and the hot key's drains.
#[derive(Clone, Debug)]
pub(crate) struct Keyed {
    pub(crate) workers: usize,
    /// The plain drain (base) and the keyed drain (variant).
    pub(crate) pairs: Pairs,
    pub(crate) hot: Vec<DrainRun>,
}

impl Keyed {
    /// The median of the hot key's runs' per-item gaps (p50, p90), ms.
    pub(crate) fn hot_gap_ms(&self) -> Option<(f64, f64)> {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let gaps: Vec<_> = self.hot.iter().filter_map(|r| r.key_gaps.clone()).collect();
        Some((
            median(gaps.iter().map(|g| g.p50_ms).collect())?,
            median(gaps.iter().map(|g| g.p90_ms).collect())?,
        ))
    }

    /// The median of the fills' rates of `runs` (enqueue, items/s).
    pub(crate) fn enqueue_median(runs: &[DrainRun]) -> f64 {
        let mut rates: Vec<f64> = runs.iter().map(|r| r.enqueue_rate).collect();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "pair_ratios": self.pairs.ratios().iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            "ratio_of_medians": (self.pairs.ratio_of_medians() * 1000.0).round() / 1000.0,
            "plain_runs": self.pairs.base.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "keyed_runs": self.pairs.variant.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
            "hot_key_runs": self.hot.iter().map(DrainRun::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The pairs of plain and keyed drains, then the hot key, each drain by `workers` processes.
pub(crate) async fn run(ctx: &Ctx, workers: usize) -> BenchResult<Keyed> {
    let plain = Shape::plain(workers, ITEMS);
    let keyed = plain.clone().keys(KEYS);
    let mut pairs = Pairs::default();
    for pair in 0..ctx.plan.keyed_pairs {
        for variant in Pairs::order(pair) {
            let run = drain::run_once(ctx, if variant { &keyed } else { &plain }).await?;
            eprintln!(
                "bench: {} drain, {workers} worker(s), pair {}/{}: {:.0} items/s (enqueue {:.0} items/s)",
                if variant { "keyed" } else { "plain" },
                pair + 1,
                ctx.plan.keyed_pairs,
                run.rate,
                run.enqueue_rate
            );
            pairs.push(variant, run);
        }
    }
    let hot_key = Shape::plain(workers, HOT_KEY_ITEMS).keys(1);
    let mut hot = Vec::new();
    for i in 0..ctx.plan.hot_key_runs {
        let run = drain::run_once(ctx, &hot_key).await?;
        eprintln!(
            "bench: one hot key, {workers} worker(s), run {}/{}: {:.0} items/s{}",
            i + 1,
            ctx.plan.hot_key_runs,
            run.rate,
            run.key_gaps.as_ref().map_or(String::new(), |g| format!(
                " (per item p50 {} ms, p90 {} ms)",
                g.p50_ms, g.p90_ms
            ))
        );
        hot.push(run);
    }
    Ok(Keyed {
        workers,
        pairs,
        hot,
    })
}
