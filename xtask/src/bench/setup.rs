//! What every scenario stands on: the server (the durable bench cluster, or `DATABASE_URL`'s),
//! a fresh migrated database per scenario, the database-side counters (pg_stat_statements,
//! pg_stat_user_functions, the WAL position) and the CPU counters of `/proc`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection};
use workpump_coordinator::PgCoordinator;
use workpump_testdb::Cluster;

use super::BenchResult;

/// The queue every scenario uses.
pub(crate) const QUEUE: &str = "bench";

/// The schema the workers and the bench use.
pub(crate) const SCHEMA: &str = workpump_coordinator::DEFAULT_SCHEMA;

/// Marks the bench's own monitoring statements so that counts of what the workers sent can
/// leave them out (pg_stat_statements keeps comments in the stored query text).
pub(crate) const MARK: &str = "/* wp-bench */";

/// Connections of a bench database's pool (16 producers plus monitoring).
const POOL_CONNECTIONS: u32 = 24;

/// The PostgreSQL server the bench runs against.
pub(crate) struct Target {
    admin_url: String,
    /// The bench cluster, when we run it (not for `DATABASE_URL`).
    cluster: Option<Cluster>,
    /// `DATABASE_URL`'s server.
    external: Option<&'static workpump_testdb::Server>,
    bin_dir: PathBuf,
}

impl Target {
    /// `DATABASE_URL`'s server if set, else the durable bench cluster (started if needed).
    pub(crate) async fn open() -> BenchResult<Target> {
        let cluster = tokio::task::spawn_blocking(Cluster::bench).await??;
        let bin_dir = cluster.bin_dir().to_owned();
        if std::env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty()) {
            let server = workpump_testdb::server().await?;
            return Ok(Target {
                admin_url: server.admin_url().to_owned(),
                cluster: None,
                external: Some(server),
                bin_dir,
            });
        }
        let cluster = tokio::task::spawn_blocking(move || {
            cluster.start()?;
            Ok::<_, workpump_testdb::Error>(cluster)
        })
        .await??;
        Ok(Target {
            admin_url: cluster.url("postgres"),
            cluster: Some(cluster),
            external: None,
            bin_dir,
        })
    }

    /// Where the server is, for the report.
    pub(crate) fn describe(&self) -> String {
        match (&self.cluster, &self.external) {
            (Some(c), _) => format!("the durable bench cluster ({})", c.data_dir().display()),
            _ => "DATABASE_URL's server".to_owned(),
        }
    }

    /// The URL of database `db`.
    pub(crate) fn url(&self, db: &str) -> String {
        match (&self.cluster, &self.external) {
            (Some(c), _) => c.url(db),
            (None, Some(s)) => s.url_for(db),
            (None, None) => unreachable!("a target is a cluster or a server"),
        }
    }

    /// The server's version and the settings that shape the figures.
    pub(crate) async fn server_info(&self) -> BenchResult<Vec<(String, String)>> {
        let mut admin = connect(&self.admin_url).await?;
        let mut info: Vec<(String, String)> = vec![(
            "version".to_owned(),
            sqlx::query_scalar("SELECT version()")
                .fetch_one(&mut admin)
                .await?,
        )];
        let settings: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, current_setting(name) FROM pg_settings
             WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers',
                            'max_wal_size', 'wal_level', 'shared_preload_libraries',
                            'track_functions', 'max_connections', 'checkpoint_timeout')
             ORDER BY name",
        )
        .fetch_all(&mut admin)
        .await?;
        info.extend(settings);
        let _ = admin.close().await;
        Ok(info)
    }

    /// The PostgreSQL binaries (`pgbench`).
    pub(crate) fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The postmaster's pid, when the server runs on this machine as our cluster.
    pub(crate) fn postmaster_pid(&self) -> Option<u32> {
        let cluster = self.cluster.as_ref()?;
        let text = fs::read_to_string(cluster.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// A fresh database `wpbench_<tag>_<pid>_<n>`, migrated, with queue `bench` registered
    /// and pg_stat_statements created when the server has it. The worker under test migrates
    /// it and registers the queue (started once, drained at once), so the schema is always
    /// the one that worker was built with, whatever the bench itself was built from.
    pub(crate) async fn create_db(
        &self,
        tag: &str,
        worker_bin: &Path,
        logs: &Path,
    ) -> BenchResult<BenchDb> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "wpbench_{tag}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = connect(&self.admin_url).await?;
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await?;
        let _ = admin.close().await;
        let db = BenchDb {
            url: self.url(&name),
            name,
            admin_url: self.admin_url.clone(),
            pool: None,
            has_statements: false,
            has_toplevel: false,
            completing: std::sync::Mutex::new(HashMap::new()),
        };
        let (mut workers, _) = super::worker::start_all(
            worker_bin,
            &db.url,
            &super::worker::Spec::defaults(),
            1,
            logs,
            &format!("{tag}-migrate"),
        )
        .await?;
        workers.terminate(Duration::from_secs(10)).await;
        db.setup().await
    }
}

/// One scenario's database; dropped (with its connections) when this is dropped.
pub(crate) struct BenchDb {
    name: String,
    url: String,
    admin_url: String,
    pool: Option<PgPool>,
    has_statements: bool,
    /// Whether pg_stat_statements tells top-level statements from nested ones (`toplevel`,
    /// PostgreSQL 14 and later): the counts are of top-level statements, what a client sent,
    /// even where `pg_stat_statements.track = all` also counts the statements that functions
    /// run.
    has_toplevel: bool,
    /// pg_stat_statements entries of this database seen so far: query id → whether it is a
    /// workers' `complete_work` call ([`BenchDb::completed_progress`]).
    completing: std::sync::Mutex<HashMap<i64, bool>>,
}

impl BenchDb {
    async fn setup(mut self) -> BenchResult<BenchDb> {
        // No statement of the bench may hang it: every one is bounded.
        let options = self
            .url
            .parse::<PgConnectOptions>()?
            .options([("statement_timeout", "300s")])
            .disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(POOL_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        self.has_statements = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await
            .is_ok()
            && sqlx::query("SELECT 1 FROM pg_stat_statements LIMIT 1")
                .fetch_optional(&pool)
                .await
                .is_ok();
        self.has_toplevel = self.has_statements
            && sqlx::query_scalar(&format!(
                "{MARK} SELECT EXISTS (SELECT 1 FROM pg_attribute
                                       WHERE attrelid = 'pg_stat_statements'::regclass
                                         AND attname = 'toplevel')"
            ))
            .fetch_one(&pool)
            .await?;
        // A `--worker-bin` built before completed items moved to `work_history` migrated a
        // schema without it: the bench reads every item through `work_all`, which is then
        // `work` alone, and vacuums an empty `work_history` (an A/B across that change).
        let has_history: bool = sqlx::query_scalar(&format!(
            "{MARK} SELECT to_regclass('{SCHEMA}.work_history') IS NOT NULL"
        ))
        .fetch_one(&pool)
        .await?;
        if !has_history {
            sqlx::raw_sql(&format!(
                "{MARK} CREATE VIEW {SCHEMA}.work_all AS SELECT * FROM {SCHEMA}.work;
                 CREATE TABLE {SCHEMA}.work_history ()"
            ))
            .execute(&pool)
            .await?;
        }
        self.pool = Some(pool);
        Ok(self)
    }

    /// The database's URL (for the workers).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The bench's pool on it.
    pub(crate) fn pool(&self) -> &PgPool {
        self.pool.as_ref().expect("set up before use")
    }

    /// A coordinator on the bench's pool.
    pub(crate) fn coordinator(&self) -> PgCoordinator {
        PgCoordinator::new(self.pool().clone())
    }

    /// Whether pg_stat_statements answers here.
    pub(crate) fn has_statements(&self) -> bool {
        self.has_statements
    }

    /// Pauses or resumes queue `bench` (claim_work skips paused queues); resuming sends the
    /// wake NOTIFY in the same transaction and returns that transaction's `now()` as epoch
    /// seconds on the database clock.
    pub(crate) async fn set_paused(&self, paused: bool) -> BenchResult<f64> {
        let sql = format!(
            "{MARK} WITH u AS (UPDATE {SCHEMA}.queues SET paused = $1 WHERE name = $2 RETURNING 1),
                  n AS (SELECT pg_notify('{SCHEMA}.wake', $2) WHERE NOT $1)
             SELECT extract(epoch FROM now())::float8 FROM u LEFT JOIN n ON true"
        );
        let t: f64 = sqlx::query_scalar(&sql)
            .bind(paused)
            .bind(QUEUE)
            .fetch_one(self.pool())
            .await?;
        Ok(t)
    }

    /// Runs `VACUUM ANALYZE` on the work table and a `CHECKPOINT`, so that a measurement
    /// starts from the steady state autovacuum would reach and no checkpoint is owed.
    pub(crate) async fn settle(&self) -> BenchResult<()> {
        sqlx::raw_sql(&format!(
            "VACUUM ANALYZE {SCHEMA}.work, {SCHEMA}.work_history"
        ))
        .execute(self.pool())
        .await?;
        sqlx::raw_sql("CHECKPOINT").execute(self.pool()).await?;
        Ok(())
    }

    /// A count on the work table (`WHERE` clause given).
    pub(crate) async fn count(&self, condition: &str) -> BenchResult<i64> {
        let sql = format!("{MARK} SELECT count(*) FROM {SCHEMA}.work_all WHERE {condition}");
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }

    /// Statement counters of this database, or `None` without pg_stat_statements.
    pub(crate) async fn statements(&self) -> BenchResult<Option<Statements>> {
        if !self.has_statements {
            return Ok(None);
        }
        let sql = format!(
            "{MARK} SELECT coalesce(queryid, 0)::int8, min(query), sum(calls)::int8, sum(rows)::int8,
                    sum(total_exec_time)::float8
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND query NOT LIKE '%wp-bench%' {toplevel}
             GROUP BY 1",
            toplevel = if self.has_toplevel { "AND toplevel" } else { "" }
        );
        let rows: Vec<(i64, String, i64, i64, f64)> =
            sqlx::query_as(&sql).fetch_all(self.pool()).await?;
        Ok(Some(Statements(
            rows.into_iter()
                .map(|(id, query, calls, rows, ms)| {
                    (
                        id,
                        Statement {
                            query,
                            calls,
                            rows,
                            total_ms: ms,
                        },
                    )
                })
                .collect(),
        )))
    }

    /// Completed items so far, as the rows `complete_work` returned (pg_stat_statements: a
    /// few shared-memory reads, no scan of the work table), or a count of completed rows.
    /// The counters are read without the query texts (`pg_stat_statements(false)`): reading
    /// the texts means reading the server's whole query-text file, which holds the statements
    /// of every database of the cluster (0.2 s a read with 5 000 entries, polled every 100 ms).
    /// The texts are read only for query ids not seen before, to tell which are
    /// `complete_work`.
    pub(crate) async fn completed_progress(&self) -> BenchResult<i64> {
        if !self.has_statements {
            return self.count("state = 'completed'").await;
        }
        let this_db = "dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";
        let counters: Vec<(i64, i64)> = sqlx::query_as(&format!(
            "{MARK} SELECT coalesce(queryid, 0)::int8, sum(rows)::int8 FROM pg_stat_statements(false)
             WHERE {this_db} GROUP BY 1"
        ))
        .fetch_all(self.pool())
        .await?;
        let unknown: Vec<i64> = {
            let known = self.completing.lock().expect("not poisoned");
            counters
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| !known.contains_key(id))
                .collect()
        };
        if !unknown.is_empty() {
            let kinds: Vec<(i64, bool)> = sqlx::query_as(&format!(
                "{MARK} SELECT coalesce(queryid, 0)::int8,
                        bool_or(query LIKE '%.complete_work(%' AND query NOT LIKE '%wp-bench%')
                 FROM pg_stat_statements WHERE {this_db} AND coalesce(queryid, 0) = ANY($1)
                 GROUP BY 1"
            ))
            .bind(&unknown)
            .fetch_all(self.pool())
            .await?;
            self.completing.lock().expect("not poisoned").extend(kinds);
        }
        let known = self.completing.lock().expect("not poisoned");
        Ok(counters
            .iter()
            .filter(|(id, _)| known.get(id).copied().unwrap_or(false))
            .map(|(_, rows)| rows)
            .sum())
    }

    /// Function counters of the workpump schema (`track_functions = 'all'`): name → calls.
    /// They lag: a backend flushes them at most once a second while busy.
    pub(crate) async fn function_calls(&self) -> BenchResult<HashMap<String, i64>> {
        let sql = format!(
            "{MARK} SELECT funcname::text, calls FROM pg_stat_user_functions WHERE schemaname = $1"
        );
        let rows: Vec<(String, i64)> = sqlx::query_as(&sql)
            .bind(SCHEMA)
            .fetch_all(self.pool())
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// The WAL insert position in bytes.
    pub(crate) async fn wal_bytes(&self) -> BenchResult<f64> {
        let sql = format!("{MARK} SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::float8");
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }

    /// Committed transactions of this database (pg_stat_database; lags like the functions).
    pub(crate) async fn xact_commit(&self) -> BenchResult<i64> {
        let sql = format!(
            "{MARK} SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }

    /// Closes the pool and drops the database now.
    /// Its pg_stat_statements entries are removed first: those of dropped databases would
    /// otherwise stay until the server evicts them (at `pg_stat_statements.max`, 5 000), and
    /// every read of the view with texts reads all of their texts (11.7 MB after a morning of
    /// runs: 0.2 s a read). Best effort (it needs a superuser or a granted role).
    pub(crate) async fn drop_now(mut self) -> BenchResult<()> {
        if let Some(pool) = self.pool.take() {
            if self.has_statements {
                let _ = sqlx::query(&format!(
                    "{MARK} SELECT pg_stat_statements_reset(0,
                        (SELECT oid FROM pg_database WHERE datname = current_database()), 0)"
                ))
                .execute(&pool)
                .await;
            }
            pool.close().await;
        }
        let name = std::mem::take(&mut self.name);
        drop_database(&self.admin_url, &name).await
    }
}

impl Drop for BenchDb {
    /// Drops the database on a thread with its own runtime (this may run inside one), and
    /// waits for it; errors are printed and otherwise ignored.
    fn drop(&mut self) {
        if self.name.is_empty() {
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = std::mem::take(&mut self.name);
        let pool = self.pool.take();
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                if let Some(pool) = pool {
                    pool.close().await;
                }
                drop_database(&admin_url, &name).await
            })
        })
        .join();
        if let Ok(Err(error)) = outcome {
            eprintln!("bench: could not drop a bench database: {error}");
        }
    }
}

/// A connection that does not log slow statements (CHECKPOINT, DROP DATABASE are slow on
/// purpose here).
async fn connect(url: &str) -> BenchResult<PgConnection> {
    let options = url.parse::<PgConnectOptions>()?.disable_statement_logging();
    Ok(PgConnection::connect_with(&options).await?)
}

async fn drop_database(admin_url: &str, name: &str) -> BenchResult<()> {
    let mut admin = connect(admin_url).await?;
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    let _ = admin.close().await;
    Ok(())
}

/// One normalised statement's counters.
#[derive(Clone, Debug)]
pub(crate) struct Statement {
    pub(crate) query: String,
    pub(crate) calls: i64,
    pub(crate) rows: i64,
    pub(crate) total_ms: f64,
}

/// pg_stat_statements of one database at one moment, by query id.
#[derive(Clone, Debug, Default)]
pub(crate) struct Statements(HashMap<i64, Statement>);

impl Statements {
    /// What happened between `earlier` and `self`, busiest (by time) first; statements that
    /// did not run are left out.
    pub(crate) fn since(&self, earlier: &Statements) -> Vec<Statement> {
        let mut out: Vec<Statement> = self
            .0
            .iter()
            .filter_map(|(id, now)| {
                let before = earlier.0.get(id);
                let calls = now.calls - before.map_or(0, |b| b.calls);
                (calls > 0).then(|| Statement {
                    query: now.query.clone(),
                    calls,
                    rows: now.rows - before.map_or(0, |b| b.rows),
                    total_ms: now.total_ms - before.map_or(0.0, |b| b.total_ms),
                })
            })
            .collect();
        out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        out
    }
}

/// Sums of a statement delta list for the statements whose text contains `needle`.
pub(crate) fn sum_matching(stmts: &[Statement], needle: &str) -> (i64, i64, f64) {
    stmts
        .iter()
        .filter(|s| s.query.contains(needle))
        .fold((0, 0, 0.0), |(c, r, t), s| {
            (c + s.calls, r + s.rows, t + s.total_ms)
        })
}

/// A short, one-line name for a statement: the workpump function it calls, or its first
/// words.
pub(crate) fn short_name(query: &str) -> String {
    let flat: String = query
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(at) = flat.find(&format!("\"{SCHEMA}\".")) {
        let rest = &flat[at + SCHEMA.len() + 3..];
        let end = rest.find('(').unwrap_or(rest.len());
        return format!("{}()", &rest[..end]);
    }
    let mut short: String = flat.chars().take(60).collect();
    if flat.chars().count() > 60 {
        short.push('…');
    }
    short
}

/// CPU time (user + system) of a process and its threads, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    // Fields after the command name: state is field 3, utime 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU ticks of the postmaster and all its children (the server's processes). Backends that
/// exited since are not counted; the workers' pooled connections live through a scenario.
pub(crate) fn server_cpu_ticks(postmaster: u32) -> u64 {
    let mut total = cpu_ticks(postmaster).unwrap_or(0);
    let Ok(entries) = fs::read_dir("/proc") else {
        return total;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(fields) = stat_fields(pid) else {
            continue;
        };
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(postmaster) {
            total += cpu_ticks(pid).unwrap_or(0);
        }
    }
    total
}

fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// Busy CPU ticks of the whole machine (all CPUs: everything but idle and iowait), from
/// `/proc/stat`; with the server's and the workers' ticks it tells how much other programs
/// used the machine during a measurement.
pub(crate) fn machine_busy_ticks() -> u64 {
    let Ok(text) = fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest is in user.
    values
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum()
}

/// The median time of writing 8 kB and `fdatasync` (what a commit waits for), in ms, over
/// 30 tries in a file in `dir`; the disk under the WAL is usually the one under the target
/// directory, and its latency varies with what else the machine writes.
pub(crate) fn fdatasync_ms(dir: &Path) -> Option<f64> {
    use std::io::Write;
    let path = dir.join("fdatasync.probe");
    let mut file = fs::File::create(&path).ok()?;
    let block = [0u8; 8192];
    let mut times = Vec::with_capacity(30);
    for _ in 0..30 {
        let started = std::time::Instant::now();
        file.write_all(&block).ok()?;
        file.sync_data().ok()?;
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    let _ = fs::remove_file(&path);
    times.sort_by(f64::total_cmp);
    Some((times[times.len() / 2] * 1_000.0).round() / 1_000.0)
}

/// The 1-minute load average.
pub(crate) fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux unless told otherwise).
pub(crate) fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// A `/proc/<pid>/status` value in kB (`VmHWM`, `VmRSS`).
pub(crate) fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
