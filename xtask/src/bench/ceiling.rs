//! The ceiling: what this server does with the minimal queue cycle on a plain table, run by
//! `pgbench` from the same installation, same durability, same run.
//!
//! The table is the least a queue needs: `q(id bigint primary key, state smallint, payload
//! jsonb)` with a partial index on the pending rows (`(id) WHERE state = 0`), so a claim
//! finds work the way `work_claim` does. Three scripts:
//!
//! - `single`: claim-and-complete one row per transaction:
//!   `WITH c AS (SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
//!    UPDATE q SET state = 2 FROM c WHERE q.id = c.id`;
//! - `batch100`: the same with `LIMIT 100` (one statement, one commit per 100 rows) — the
//!   figure the drain is compared with;
//! - `two_step100`: the shape workpump has — claim 100 (state 1) in one transaction, then
//!   complete them (state 2) in a second — two row versions and two commits per batch.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use super::setup::{BenchDb, MARK};
use super::{BenchResult, Ctx};

/// The longest a pgbench run may take.
const PGBENCH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Client counts pgbench runs with.
pub(crate) const CLIENTS: [usize; 4] = [1, 4, 8, 16];

const SINGLE: &str =
    "WITH c AS (SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE q SET state = 2 FROM c WHERE q.id = c.id;
";

const BATCH100: &str =
    "WITH c AS (SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE q SET state = 2 FROM c WHERE q.id = c.id;
";

const TWO_STEP100: &str =
    "WITH c AS (SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED),
     u AS (UPDATE q SET state = 1 FROM c WHERE q.id = c.id RETURNING q.id)
SELECT coalesce(array_agg(id), '{}') AS ids FROM u
\\gset
UPDATE q SET state = 2 WHERE id = ANY (:ids::bigint[]);
";

/// One pgbench run.
#[derive(Clone, Debug)]
pub(crate) struct CeilingRun {
    pub(crate) script: &'static str,
    pub(crate) clients: usize,
    pub(crate) rows_per_s: f64,
    pub(crate) rows: i64,
}

impl CeilingRun {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "script": self.script,
            "clients": self.clients,
            "rows_per_s": self.rows_per_s.round(),
            "rows": self.rows,
        })
    }
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<Vec<CeilingRun>> {
    let pgbench = ctx.target.bin_dir().join("pgbench");
    if !pgbench.is_file() {
        return Err(format!("no pgbench in {}", ctx.target.bin_dir().display()).into());
    }
    let db = ctx.create_db("ceiling").await?;
    sqlx::raw_sql(
        "CREATE TABLE q (id bigint PRIMARY KEY, state smallint NOT NULL DEFAULT 0,
                         payload jsonb NOT NULL DEFAULT '{\"kind\":\"noop\"}');
         CREATE INDEX q_pending ON q (id) WHERE state = 0;",
    )
    .execute(db.pool())
    .await?;
    let dir = ctx.logs.join("pgbench");
    std::fs::create_dir_all(&dir)?;
    let mut out = Vec::new();
    for (script, text) in [
        ("single", SINGLE),
        ("batch100", BATCH100),
        ("two_step100", TWO_STEP100),
    ] {
        if script == "two_step100" && !ctx.plan.ceiling_two_step {
            continue;
        }
        let file = dir.join(format!("{script}.sql"));
        std::fs::write(&file, text)?;
        for clients in CLIENTS {
            let batched = script != "single";
            let run = one(ctx, &db, &pgbench, &file, script, clients, batched).await?;
            eprintln!(
                "bench: ceiling {script} with {clients} clients: {:.0} rows/s",
                run.rows_per_s
            );
            out.push(run);
        }
    }
    db.drop_now().await?;
    Ok(out)
}

async fn one(
    ctx: &Ctx,
    db: &BenchDb,
    pgbench: &Path,
    file: &Path,
    script: &'static str,
    clients: usize,
    batched: bool,
) -> BenchResult<CeilingRun> {
    // Batched scripts run a fixed number of transactions (every one finds 100 rows); the
    // single-row script runs for a time on a table too large to empty.
    let rows = if batched {
        ctx.plan.ceiling_batch_rows
    } else {
        ctx.plan.ceiling_single_rows
    };
    // A tenth more rows than the batched runs take, so that no transaction comes up short.
    let loaded = rows + rows / 10;
    sqlx::raw_sql(&format!(
        "TRUNCATE q; INSERT INTO q (id) SELECT g FROM generate_series(1, {loaded}) g;"
    ))
    .execute(db.pool())
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE q").execute(db.pool()).await?;
    sqlx::raw_sql("CHECKPOINT").execute(db.pool()).await?;

    let threads = clients.min(ctx.nproc).max(1);
    let mut command = Command::new(pgbench);
    command.args([
        "--no-vacuum",
        "--protocol=prepared",
        "--client",
        &clients.to_string(),
        "--jobs",
        &threads.to_string(),
        "--file",
    ]);
    command.arg(file);
    if batched {
        let per_client = (rows as usize / 100 / clients).max(1);
        command.args(["--transactions", &per_client.to_string()]);
    } else {
        command.args(["--time", &ctx.plan.ceiling_single_secs.to_string()]);
    }
    command.arg(db.url());
    // pgbench is bounded by its transaction count or time; the deadline covers a server
    // that stops answering.
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let output = tokio::time::timeout(PGBENCH_DEADLINE, command.output())
        .await
        .map_err(|_| format!("pgbench {script} -c {clients} ran past {PGBENCH_DEADLINE:?}"))??;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "pgbench {script} -c {clients} failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let tps =
        field(&stdout, "tps = ").ok_or_else(|| format!("no tps in pgbench's output: {stdout}"))?;
    let transactions = field(&stdout, "number of transactions actually processed: ")
        .ok_or_else(|| format!("no transaction count in pgbench's output: {stdout}"))?;
    let done: i64 = sqlx::query_scalar(&format!("{MARK} SELECT count(*) FROM q WHERE state = 2"))
        .fetch_one(db.pool())
        .await?;
    if done >= loaded {
        eprintln!("bench: warning: ceiling {script} -c {clients} emptied the table; the figure is a lower bound");
    }
    // pgbench's elapsed time (without connecting) is transactions / tps.
    let seconds = transactions / tps;
    Ok(CeilingRun {
        script,
        clients,
        rows_per_s: done as f64 / seconds,
        rows: done,
    })
}

/// The number that follows `label` in pgbench's output.
fn field(text: &str, label: &str) -> Option<f64> {
    let at = text.find(label)? + label.len();
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
