//! A throwaway PostgreSQL cluster under the workspace's target directory: found, initialised,
//! started, stopped — each step under a file lock, because every test process asks at once.

use std::env;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU16, Ordering};

use sqlx::postgres::PgConnectOptions;

use crate::error::{Error, Result};
use crate::install::Install;
use crate::probe;
use crate::run_as::RunAs;
use crate::url;

/// The cluster name of tests, `cargo xtask pg`, and the demo.
const TEST_NAME: &str = "test";

/// The cluster name of benchmarks.
const BENCH_NAME: &str = "bench";

/// Clusters live in `<target dir>/workpump-pg/<name>/`.
const TARGET_SUBDIR: &str = "workpump-pg";

/// Longest socket file path (`<sock dir>/.s.PGSQL.<port>`) we accept; the kernel's limit is
/// 107 bytes, and PostgreSQL refuses paths near it.
const MAX_SOCKET_PATH: usize = 100;

/// How long `pg_ctl` waits for the server to start or stop, in seconds.
const PG_CTL_WAIT_SECS: &str = "60";

/// Lines of the server log quoted when starting fails.
const LOG_TAIL_LINES: usize = 20;

/// The settings file written into the data directory at every start, included from
/// `postgresql.conf`.
const SETTINGS_FILE: &str = "workpump.conf";

/// How [`Cluster::stop`] and [`Cluster::restart`] shut the server down: `pg_ctl stop -m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Wait for every client to disconnect.
    Smart,
    /// Roll back open transactions and disconnect clients, then shut down cleanly.
    Fast,
    /// Kill every server process at once; the next start runs crash recovery. The fault
    /// suite's "database crash".
    Immediate,
}

impl StopMode {
    fn as_str(self) -> &'static str {
        match self {
            StopMode::Smart => "smart",
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

impl fmt::Display for StopMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One throwaway PostgreSQL cluster, in `<target dir>/workpump-pg/<name>/` (or
/// `/tmp/workpump-pg-<hash>/<name>/` when the server's user cannot reach the target directory
/// or the socket path would be too long):
///
/// - `data/` — the data directory; `data/workpump.conf` holds our settings;
/// - `sock/` — the unix socket directory;
/// - `postgres.log` — the server log;
/// - `port` — the TCP port, chosen free at `initdb` time and kept for the cluster's life;
/// - `../<name>.lock` — the lock that serialises init, start and stop across processes.
///
/// The server listens on 127.0.0.1 and the socket, trusts every local connection as user
/// `postgres`, and allows 400 connections. A cluster that is not durable (`"test"`) runs with
/// `fsync`, `synchronous_commit` and `full_page_writes` off. A started server keeps running
/// after the process exits, so the next run reuses it; [`Cluster::stop`] stops it.
///
/// All methods block; async callers use `tokio::task::spawn_blocking`.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    durable: bool,
    dir: PathBuf,
    data_dir: PathBuf,
    sock_dir: PathBuf,
    log_file: PathBuf,
    port_file: PathBuf,
    lock_file: PathBuf,
    install: Install,
    run_as: RunAs,
    /// 0 until the cluster has been initialised (by any process).
    port: AtomicU16,
}

/// What `postmaster.pid` says.
pub(crate) enum Postmaster {
    /// No pid file: the server is down.
    Absent,
    /// A pid file whose process is gone or is not our server (a killed run, a reused pid).
    Stale,
    /// Our server's process, with the status word it wrote (`ready`, `starting`, `stopping`).
    Ours { pid: u32, status: String },
}

impl Cluster {
    /// Describes cluster `name`: finds the binaries and the directories, decides who runs the
    /// server. No side effects; [`Cluster::start`] creates what is missing.
    ///
    /// `durable` keeps PostgreSQL's durability settings; otherwise `fsync`,
    /// `synchronous_commit` and `full_page_writes` are off, which a test cluster wants.
    pub fn new(name: &str, durable: bool) -> Result<Cluster> {
        validate_name(name)?;
        let install = Install::find()?;
        let run_as = RunAs::detect()?;
        let base = choose_base(&target_dir(), name, &run_as);
        let dir = base.join(name);
        let port_file = dir.join("port");
        let port = read_port(&port_file).unwrap_or(0);
        Ok(Cluster {
            name: name.to_owned(),
            durable,
            data_dir: dir.join("data"),
            sock_dir: dir.join("sock"),
            log_file: dir.join("postgres.log"),
            lock_file: base.join(format!("{name}.lock")),
            port_file,
            dir,
            install,
            run_as,
            port: AtomicU16::new(port),
        })
    }

    /// The `"test"` cluster (not durable): tests, `cargo xtask pg`, the demo.
    pub fn test() -> Result<Cluster> {
        Cluster::new(TEST_NAME, false)
    }

    /// The `"bench"` cluster (durable): benchmarks.
    pub fn bench() -> Result<Cluster> {
        Cluster::new(BENCH_NAME, true)
    }

    /// Makes sure the server runs: reuses a running one, starts a stopped one (clearing a
    /// stale `postmaster.pid` left by a killed run), or initialises and starts a new one.
    /// Idempotent, and safe to call from many processes at once.
    pub fn start(&self) -> Result<()> {
        let _lock = self.lock()?;
        self.start_locked()
    }

    /// Stops the server (`pg_ctl stop -m fast`) if it runs. Idempotent.
    pub fn stop(&self) -> Result<()> {
        self.stop_with(StopMode::Fast)
    }

    /// Stops the server the `mode` way if it runs, and leaves it stopped: with
    /// [`StopMode::Immediate`], the fault suite's crash of a primary before a failover.
    /// Idempotent.
    pub fn stop_with(&self, mode: StopMode) -> Result<()> {
        let _lock = self.lock()?;
        self.stop_locked(mode)
    }

    /// Stops the server the `mode` way (if it runs) and starts it again, waiting until it
    /// accepts connections. Clients lose their connections; the port and URLs stay.
    pub fn restart(&self, mode: StopMode) -> Result<()> {
        let _lock = self.lock()?;
        self.stop_locked(mode)?;
        self.start_locked()
    }

    /// Whether the server runs: it accepts connections on its socket, or its process says it
    /// is ready (and is merely out of connection slots).
    pub fn is_running(&self) -> bool {
        self.accepts_connections()
            || matches!(self.postmaster(), Postmaster::Ours { status, .. } if status == "ready")
    }

    /// Whether `initdb` has run for this cluster (by any process).
    pub fn is_initialised(&self) -> bool {
        self.data_dir.join("PG_VERSION").is_file() && self.port_file.is_file()
    }

    /// The URL of database `db` through the unix socket:
    /// `postgres://postgres@localhost/<db>?host=<sock dir>&port=<port>`.
    pub fn url(&self, db: &str) -> String {
        url::socket_url(&self.sock_dir, self.port(), db)
    }

    /// The URL of database `db` over TCP: `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn tcp_url(&self, db: &str) -> String {
        url::tcp_url(self.port(), db)
    }

    /// What [`url`](Self::url) says, as sqlx's connect options: database `db` as the
    /// `postgres` user through the unix socket.
    pub fn connect_options(&self, db: &str) -> PgConnectOptions {
        url::socket_options(&self.sock_dir, self.port(), db)
    }

    /// The cluster's name, e.g. `"test"`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory of the PostgreSQL binaries this cluster runs, so that e.g. a benchmark
    /// runs `pgbench` from the same installation.
    pub fn bin_dir(&self) -> &Path {
        &self.install.bin_dir
    }

    /// The unix socket directory.
    pub(crate) fn sock_dir(&self) -> &Path {
        &self.sock_dir
    }

    /// The binaries this cluster runs.
    pub(crate) fn install(&self) -> &Install {
        &self.install
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The TCP port, which also names the socket file. Chosen when the cluster is
    /// initialised and kept across restarts; 0 while no process has initialised it yet.
    pub fn port(&self) -> u16 {
        match self.port.load(Ordering::Relaxed) {
            0 => {
                let port = read_port(&self.port_file).unwrap_or(0);
                self.port.store(port, Ordering::Relaxed);
                port
            }
            port => port,
        }
    }

    fn start_locked(&self) -> Result<()> {
        // Another process may have initialised the cluster since `new`.
        if let Some(port) = read_port(&self.port_file) {
            self.port.store(port, Ordering::Relaxed);
        }
        if self.accepts_connections() {
            tracing::debug!(cluster = %self.name, "reusing the running server");
            return Ok(());
        }
        match self.postmaster() {
            Postmaster::Ours { status, .. } if status == "ready" => {
                tracing::debug!(cluster = %self.name, "reusing the running server (it is busy)");
                return Ok(());
            }
            Postmaster::Ours { pid, .. } => {
                return Err(Error::Unresponsive {
                    pid,
                    data_dir: self.data_dir.display().to_string(),
                });
            }
            Postmaster::Absent | Postmaster::Stale => {}
        }

        self.prepare_dirs()?;
        if !self.is_initialised() {
            self.init()?;
        }
        self.remove_stale_lock_files()?;
        self.write_settings("")?;

        let log_offset = self.log_len();
        let Err(error) = self.pg_ctl_start(log_offset) else {
            return Ok(());
        };
        // The port was free at init time; something else may have taken it since.
        if !self
            .log_since(log_offset)
            .contains("Address already in use")
        {
            return Err(error);
        }
        let port = free_port()?;
        tracing::warn!(
            cluster = %self.name,
            old = self.port(),
            new = port,
            "the cluster's port is taken by another program; moving to a new port"
        );
        self.set_port(port)?;
        self.write_settings("")?;
        let log_offset = self.log_len();
        self.pg_ctl_start(log_offset)
    }

    pub(crate) fn stop_locked(&self, mode: StopMode) -> Result<()> {
        match self.postmaster() {
            Postmaster::Absent => Ok(()),
            Postmaster::Stale => self.remove_stale_lock_files(),
            Postmaster::Ours { .. } => self.run(
                "pg_ctl stop",
                "pg_ctl",
                [
                    OsStr::new("stop"),
                    OsStr::new("-D"),
                    self.data_dir.as_os_str(),
                    OsStr::new("-m"),
                    OsStr::new(mode.as_str()),
                    OsStr::new("-w"),
                    OsStr::new("-t"),
                    OsStr::new(PG_CTL_WAIT_SECS),
                    OsStr::new("-s"),
                ],
                None,
            ),
        }
    }

    /// Takes the cluster's exclusive lock; it is released when the file is dropped.
    pub(crate) fn lock(&self) -> Result<File> {
        let base = self.lock_file.parent().unwrap_or(Path::new("/"));
        create_reachable_dir(base)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_file)
            .map_err(Error::io(format!("opening {}", self.lock_file.display())))?;
        file.lock()
            .map_err(Error::io(format!("locking {}", self.lock_file.display())))?;
        Ok(file)
    }

    pub(crate) fn prepare_dirs(&self) -> Result<()> {
        for dir in [&self.dir, &self.sock_dir] {
            fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        }
        self.run_as.hand_over(&self.dir)
    }

    fn init(&self) -> Result<()> {
        if self.data_dir.exists() {
            tracing::warn!(
                data_dir = %self.data_dir.display(),
                "removing the leftover of an interrupted initdb"
            );
            fs::remove_dir_all(&self.data_dir)
                .map_err(Error::io(format!("removing {}", self.data_dir.display())))?;
        }
        tracing::info!(cluster = %self.name, data_dir = %self.data_dir.display(), "initdb");
        let mut args = vec![
            OsStr::new("-D"),
            self.data_dir.as_os_str(),
            OsStr::new("-U"),
            OsStr::new("postgres"),
            OsStr::new("--auth=trust"),
            OsStr::new("--encoding=UTF8"),
            OsStr::new("--locale=C"),
        ];
        if !self.durable {
            args.push(OsStr::new("--no-sync"));
        }
        self.run("initdb", "initdb", args, None)?;

        let conf = self.data_dir.join("postgresql.conf");
        let mut file = OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(Error::io(format!("opening {}", conf.display())))?;
        writeln!(
            file,
            "\n# Added by workpump-testdb.\ninclude_if_exists = '{SETTINGS_FILE}'"
        )
        .map_err(Error::io(format!("writing {}", conf.display())))?;

        // Written last: its presence marks the cluster initialised.
        self.set_port(free_port()?)
    }

    /// Writes the settings file, with `extra` lines at its end (a standby's name, a
    /// primary's synchronous standby); it is rewritten at every start, so changes here reach
    /// an existing cluster at its next start, and extras last until then.
    pub(crate) fn write_settings(&self, extra: &str) -> Result<()> {
        let mut settings = format!(
            "# Written by workpump-testdb at every start; edits are overwritten.\n\
             listen_addresses = '127.0.0.1'\n\
             port = {}\n\
             unix_socket_directories = '{}'\n\
             max_connections = 400\n\
             track_functions = 'all'\n",
            self.port(),
            conf_escape(&self.sock_dir.to_string_lossy()),
        );
        if self.install.has_extension("pg_stat_statements") {
            settings.push_str("shared_preload_libraries = 'pg_stat_statements'\n");
        }
        if !self.durable {
            settings.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        }
        settings.push_str(extra);
        let path = self.data_dir.join(SETTINGS_FILE);
        fs::write(&path, settings).map_err(Error::io(format!("writing {}", path.display())))?;
        self.run_as.hand_over(&path)
    }

    pub(crate) fn pg_ctl_start(&self, log_offset: u64) -> Result<()> {
        tracing::info!(cluster = %self.name, port = self.port(), "starting PostgreSQL");
        self.run(
            "pg_ctl start",
            "pg_ctl",
            [
                OsStr::new("start"),
                OsStr::new("-D"),
                self.data_dir.as_os_str(),
                OsStr::new("-l"),
                self.log_file.as_os_str(),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new(PG_CTL_WAIT_SECS),
                OsStr::new("-s"),
            ],
            Some(log_offset),
        )
    }

    /// Runs one of the installation's programs as the server's user, in the cluster
    /// directory. A failure quotes the program's output and, given `log_offset`, the server
    /// log written since then.
    pub(crate) fn run<I, S>(
        &self,
        what: &str,
        program: &str,
        args: I,
        log_offset: Option<u64>,
    ) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let what = format!("{what} (cluster {:?}, {})", self.name, self.dir.display());
        let output = self
            .run_as
            .command(&self.install.program(program), args)
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .map_err(Error::io(format!("running {what}")))?;
        if output.status.success() {
            return Ok(());
        }
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        if let Some(offset) = log_offset {
            text.push_str(&format!(
                "\n--- last lines of {} ---\n{}",
                self.log_file.display(),
                self.log_tail(offset)
            ));
        }
        Err(Error::Command {
            what,
            status: output.status.to_string(),
            output: text.trim_end().to_owned(),
        })
    }

    pub(crate) fn accepts_connections(&self) -> bool {
        match self.port() {
            0 => false,
            port => probe::accepts_connections(&self.sock_dir.join(format!(".s.PGSQL.{port}"))),
        }
    }

    pub(crate) fn postmaster(&self) -> Postmaster {
        let Ok(text) = fs::read_to_string(self.data_dir.join("postmaster.pid")) else {
            return Postmaster::Absent;
        };
        let lines: Vec<&str> = text.lines().collect();
        let Some(pid) = lines.first().and_then(|line| line.trim().parse().ok()) else {
            return Postmaster::Stale;
        };
        if !is_our_postmaster(pid, &self.data_dir) {
            return Postmaster::Stale;
        }
        // Line 8 is the postmaster's status (PostgreSQL 10 and later).
        let status = lines.get(7).map_or("", |line| line.trim()).to_owned();
        Postmaster::Ours { pid, status }
    }

    /// Removes `postmaster.pid` and the socket lock file when the process they name is gone
    /// or is not our server. PostgreSQL itself only recognises a dead process; after a
    /// container restart the pid often belongs to someone else.
    fn remove_stale_lock_files(&self) -> Result<()> {
        let socket_lock = self.sock_dir.join(format!(".s.PGSQL.{}.lock", self.port()));
        for file in [self.data_dir.join("postmaster.pid"), socket_lock] {
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            let pid = text
                .lines()
                .next()
                .and_then(|line| line.trim().parse().ok());
            if pid.is_some_and(|pid| is_our_postmaster(pid, &self.data_dir)) {
                continue;
            }
            tracing::info!(file = %file.display(), ?pid, "removing a stale lock file");
            fs::remove_file(&file).map_err(Error::io(format!("removing {}", file.display())))?;
        }
        Ok(())
    }

    pub(crate) fn set_port(&self, port: u16) -> Result<()> {
        let temporary = self.port_file.with_extension("new");
        fs::write(&temporary, format!("{port}\n"))
            .and_then(|()| fs::rename(&temporary, &self.port_file))
            .map_err(Error::io(format!("writing {}", self.port_file.display())))?;
        self.port.store(port, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn log_len(&self) -> u64 {
        fs::metadata(&self.log_file).map_or(0, |meta| meta.len())
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = Vec::new();
        if let Ok(mut file) = File::open(&self.log_file) {
            if file.seek(SeekFrom::Start(offset)).is_ok() {
                let _ = file.read_to_end(&mut text);
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// The last lines of the log written since `offset`, or of the whole log if nothing was.
    pub(crate) fn log_tail(&self, offset: u64) -> String {
        let mut text = self.log_since(offset);
        if text.trim().is_empty() {
            text = self.log_since(0);
        }
        if text.trim().is_empty() {
            return "(the log is empty)".to_owned();
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

/// Names become directory names and appear in messages: keep them plain.
fn validate_name(name: &str) -> Result<()> {
    let plain = name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
    if plain && !name.is_empty() && name.len() <= 32 {
        return Ok(());
    }
    Err(Error::Invalid {
        what: format!("cluster name {name:?}"),
        reason: "use 1 to 32 ASCII letters, digits, '-' or '_'".to_owned(),
    })
}

/// Where throwaway clusters live: `CARGO_TARGET_DIR` if set (a relative one is taken from the
/// workspace root, as cargo does); else the cargo target directory the running binary was
/// built into (tests, examples and xtask run from `<target>/<profile>/...`; see
/// [`cargo_target_of`]), which is right also when this crate comes from a registry; else
/// `<workspace root>/target`.
fn target_dir() -> PathBuf {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty()) {
        return workspace_root().join(dir);
    }
    env::current_exe()
        .ok()
        .as_deref()
        .and_then(cargo_target_of)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The cargo target directory holding `exe`: its nearest ancestor with cargo's marks of one,
/// `.rustc_info.json` (written on every build) or `CACHEDIR.TAG` (written when cargo itself
/// created the directory).
fn cargo_target_of(exe: &Path) -> Option<PathBuf> {
    exe.ancestors()
        .skip(1)
        .find(|dir| dir.join(".rustc_info.json").is_file() || dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_owned)
}

/// The nearest ancestor of this crate whose `Cargo.toml` has a `[workspace]` table.
fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .find(|dir| {
            fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.lines().any(|line| line.trim() == "[workspace]"))
        })
        .unwrap_or(manifest_dir)
        .to_owned()
}

/// `<target>/workpump-pg`, unless the server's user cannot reach it or the socket path would
/// be too long; then `/tmp/workpump-pg-<hash of target>`.
fn choose_base(target: &Path, name: &str, run_as: &RunAs) -> PathBuf {
    let preferred = target.join(TARGET_SUBDIR);
    let socket_file_len =
        |base: &Path| base.join(name).join("sock").as_os_str().len() + "/.s.PGSQL.65535".len();
    let problem = if socket_file_len(&preferred) > MAX_SOCKET_PATH {
        "its socket path would exceed 100 bytes"
    } else if !run_as.can_reach(&preferred) {
        "the postgres OS user cannot reach it"
    } else {
        return preferred;
    };
    let fallback = PathBuf::from(format!(
        "/tmp/{TARGET_SUBDIR}-{:012x}",
        fnv1a(target.as_os_str().as_bytes()) >> 16
    ));
    tracing::info!(
        "the throwaway PostgreSQL lives in {} rather than {}: {problem}",
        fallback.display(),
        preferred.display()
    );
    fallback
}

/// Creates `dir` (and missing parents) readable and searchable by everyone, whatever the
/// umask, so that the server's user can pass through.
fn create_reachable_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(Error::io(format!("setting the mode of {}", dir.display())))
}

fn read_port(port_file: &Path) -> Option<u16> {
    fs::read_to_string(port_file)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|port| *port != 0)
}

/// A TCP port on 127.0.0.1 that is free right now.
pub(crate) fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(Error::io("finding a free TCP port on 127.0.0.1"))
}

/// Whether process `pid` is a PostgreSQL server working in `data_dir` (the postmaster's
/// working directory is its data directory). Without `/proc` we cannot tell and say yes, so
/// that nothing is ever removed or signalled on a guess.
fn is_our_postmaster(pid: u32, data_dir: &Path) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    let process = PathBuf::from(format!("/proc/{pid}"));
    let runs_postgres = match fs::read_link(process.join("exe")) {
        Ok(exe) => exe
            .file_name()
            .and_then(OsStr::to_str)
            .is_some_and(|name| name.starts_with("postgres") || name.starts_with("postmaster")),
        Err(_) => fs::read(process.join("cmdline"))
            .is_ok_and(|cmdline| cmdline.windows(8).any(|window| window == b"postgres")),
    };
    if !runs_postgres {
        return false;
    }
    match (fs::read_link(process.join("cwd")), data_dir.canonicalize()) {
        (Ok(cwd), Ok(data_dir)) => cwd == data_dir,
        _ => true,
    }
}

/// A string literal's content for `postgresql.conf`.
pub(crate) fn conf_escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\'', "''")
}

/// FNV-1a: a hash that stays the same across Rust releases (the fallback directory must).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_are_plain_words() {
        assert!(validate_name("test").is_ok());
        assert!(validate_name("fault-suite_2").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("../etc").is_err());
        assert!(validate_name("a b").is_err());
    }

    #[test]
    fn the_fallback_hash_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn conf_strings_escape_quotes_and_backslashes() {
        assert_eq!(conf_escape(r"/a'b\c"), r"/a''b\\c");
    }

    #[test]
    fn a_test_binary_finds_the_target_directory_it_was_built_into() {
        let exe = env::current_exe().expect("exe");
        let target = cargo_target_of(&exe).expect("a target directory above the test binary");
        assert!(exe.starts_with(&target));
        assert!(target.join(".rustc_info.json").is_file() || target.join("CACHEDIR.TAG").is_file());
        // Test binaries live in <target>/<profile>/deps.
        assert_eq!(
            exe.parent().and_then(Path::parent).and_then(Path::parent),
            Some(&*target)
        );
        assert_eq!(cargo_target_of(Path::new("/no/such/dir/binary")), None);
    }

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        let root = workspace_root();
        assert!(root.join("Cargo.toml").is_file());
        assert!(root.join("crates").join("testdb").is_dir());
    }
}
