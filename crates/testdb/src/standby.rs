//! A streaming standby of a throwaway cluster, for failover tests: a base backup
//! (`pg_basebackup -R`) of a running cluster, started on a port of its own, waited on until
//! it streams, promoted when asked, and stopped and removed when dropped.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::cluster::{conf_escape, free_port, Cluster, Postmaster, StopMode};
use crate::error::{Error, Result};
use crate::query;

/// How long a standby may take to stream, to become synchronous, or to finish a promotion.
const WAIT: Duration = Duration::from_secs(60);

/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(50);

/// How long `pg_ctl promote` waits, in seconds.
const PROMOTE_WAIT_SECS: &str = "60";

/// How the primary's commits wait for the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Commits do not wait for the standby: a failover loses the transactions it had not
    /// received yet — PostgreSQL's default, and what most production setups run.
    Asynchronous,
    /// While the standby lives, the primary runs with it as its synchronous standby
    /// (`synchronous_standby_names`) and `synchronous_commit = on`: a commit returns only once
    /// the standby has its WAL, so a failover loses no committed transaction (and, while the
    /// standby is down, commits wait). Stopping the standby takes both settings back.
    Synchronous,
}

/// A streaming standby of a running cluster: a cluster of its own (its own directory under
/// the same base, its own port, socket and log) made by [`Cluster::start_standby`]. It is a
/// hot standby: it accepts read-only sessions, and [`Standby::promote`] makes it a primary.
///
/// [`Standby::stop`] — or dropping it, on any path — stops its server (by the pid in its
/// `postmaster.pid`, after checking that the process is its server), removes its data
/// directory, and takes a synchronous primary's settings back. The primary itself is the
/// caller's: stop it with [`Cluster::stop_with`] for a failover, start it again with
/// [`Cluster::start`] (its settings are rewritten at every start).
///
/// ```no_run
/// # fn example() -> workpump_testdb::Result<()> {
/// use workpump_testdb::{Cluster, Replication, StopMode};
///
/// let primary = Cluster::new("failover", false)?;
/// primary.start()?;
/// let standby = primary.start_standby("failover-standby", Replication::Synchronous)?;
/// let url = standby.failover_url("postgres"); // primary first, then the standby
/// // ... clients connect with `url` and work ...
/// primary.stop_with(StopMode::Immediate)?; // the crash
/// standby.promote()?; // the failover: clients move to the standby
/// // ... clients recover ...
/// standby.stop()?;
/// primary.start()?; // the old primary, on its own again
/// # Ok(())
/// # }
/// ```
///
/// All methods block; async callers use `tokio::task::spawn_blocking` or `block_in_place`.
#[derive(Debug)]
pub struct Standby<'a> {
    primary: &'a Cluster,
    cluster: Cluster,
    replication: Replication,
    stopped: bool,
}

impl Cluster {
    /// Makes a streaming standby of this running cluster as cluster `name` and starts it:
    /// stops and removes whatever an earlier run left under that name, takes a base backup
    /// (`pg_basebackup -R -X stream`, as the server's OS user) into its data directory, gives
    /// it a free port on 127.0.0.1 and a socket directory of its own, starts it, and waits
    /// until it streams from this cluster (and, for [`Replication::Synchronous`], until this
    /// cluster reports it as its synchronous standby). On any error, everything it started
    /// is stopped again.
    ///
    /// Needs `pg_basebackup` beside this cluster's `initdb`.
    pub fn start_standby(&self, name: &str, replication: Replication) -> Result<Standby<'_>> {
        if name == self.name() {
            return Err(Error::Invalid {
                what: format!("standby name {name:?}"),
                reason: "a standby needs a name of its own, not its primary's".to_owned(),
            });
        }
        let basebackup = self.install().program("pg_basebackup");
        if !basebackup.is_file() {
            return Err(Error::ProgramMissing {
                program: "pg_basebackup".to_owned(),
                bin_dir: self.bin_dir().display().to_string(),
            });
        }
        if !self.accepts_connections() {
            return Err(Error::Invalid {
                what: format!("primary cluster {:?}", self.name()),
                reason: "it does not accept connections; start it before its standby".to_owned(),
            });
        }
        let mut standby = Standby {
            primary: self,
            cluster: Cluster::new(name, false)?,
            replication,
            stopped: false,
        };
        // On error `standby` is dropped here, which stops whatever was started.
        standby.set_up()?;
        Ok(standby)
    }
}

impl Standby<'_> {
    /// The standby's own cluster: its [`Cluster::url`], [`Cluster::tcp_url`],
    /// [`Cluster::port`] and [`Cluster::log_file`].
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// A libpq multi-host URL of database `db` that lists the primary, then this standby,
    /// over TCP, with `target_session_attrs=read-write`: what a client that must follow a
    /// failover connects with.
    pub fn failover_url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.primary.port(),
            self.cluster.port()
        )
    }

    /// Whether the standby is still in recovery (`pg_is_in_recovery()`): true until it is
    /// promoted.
    pub fn is_in_recovery(&self) -> Result<bool> {
        let answer = query::text(
            &self.cluster.url("postgres"),
            "SELECT pg_is_in_recovery()::text",
        )?;
        Ok(answer.as_deref() == Some("true"))
    }

    /// Promotes the standby to a primary (`pg_ctl promote`) and waits, up to 60 s, until it
    /// accepts connections out of recovery (`pg_is_in_recovery()` false), so that it takes
    /// writes when this returns. Whether the old primary still runs is the caller's affair:
    /// stop it first, as a failover does.
    pub fn promote(&self) -> Result<()> {
        {
            let _lock = self.cluster.lock()?;
            let log_offset = self.cluster.log_len();
            self.cluster.run(
                "pg_ctl promote",
                "pg_ctl",
                [
                    OsStr::new("promote"),
                    OsStr::new("-D"),
                    self.cluster.data_dir().as_os_str(),
                    OsStr::new("-w"),
                    OsStr::new("-t"),
                    OsStr::new(PROMOTE_WAIT_SECS),
                    OsStr::new("-s"),
                ],
                Some(log_offset),
            )?;
        }
        let what = format!("standby {:?} promoted to a primary", self.cluster.name());
        wait_until(&self.cluster, &what, || {
            Ok(self.cluster.accepts_connections() && !self.is_in_recovery()?)
        })
    }

    /// Stops the standby's server, removes its data directory and, for a synchronous
    /// standby, takes the primary's synchronous settings back (reloading the primary if it
    /// runs). Every step is tried; the first error is returned.
    pub fn stop(mut self) -> Result<()> {
        self.shut_down()
    }

    fn set_up(&mut self) -> Result<()> {
        let name = self.cluster.name().to_owned();
        let primary = self.primary;
        {
            let _lock = self.cluster.lock()?;
            // What a killed earlier run may have left: its server, then its data.
            self.cluster.stop_locked(StopMode::Immediate)?;
            remove_dir(self.cluster.data_dir())?;
            self.cluster.prepare_dirs()?;

            tracing::info!(
                standby = %name,
                primary = %primary.name(),
                "taking a base backup for a streaming standby"
            );
            let port = primary.port().to_string();
            let args = [
                OsStr::new("-D"),
                self.cluster.data_dir().as_os_str(),
                OsStr::new("-h"),
                primary.sock_dir().as_os_str(),
                OsStr::new("-p"),
                OsStr::new(&port),
                OsStr::new("-U"),
                OsStr::new("postgres"),
                // standby.signal, and primary_conninfo through the primary's socket.
                OsStr::new("-R"),
                OsStr::new("-X"),
                OsStr::new("stream"),
                OsStr::new("-c"),
                OsStr::new("fast"),
                OsStr::new("--no-sync"),
            ];
            self.cluster
                .run("pg_basebackup", "pg_basebackup", args, None)?;

            // The copy holds the primary's settings file (its port and socket): replace it.
            self.cluster.set_port(free_port()?)?;
            self.cluster.write_settings(&format!(
                "# This cluster is a streaming standby of {:?}.\n\
                 cluster_name = '{}'\n\
                 hot_standby = on\n",
                primary.name(),
                conf_escape(&name),
            ))?;
            let log_offset = self.cluster.log_len();
            self.cluster.pg_ctl_start(log_offset)?;
        }

        let what = format!("standby {name:?} streaming from {:?}", primary.name());
        wait_until(&self.cluster, &what, || {
            let status = query::text(
                &self.cluster.url("postgres"),
                "SELECT status FROM pg_stat_wal_receiver",
            )?;
            Ok(status.as_deref() == Some("streaming"))
        })?;

        if self.replication == Replication::Synchronous {
            {
                let _lock = primary.lock()?;
                primary.write_settings(&format!(
                    "# While standby {name:?} runs, commits wait for it.\n\
                     synchronous_standby_names = '\"{}\"'\n\
                     synchronous_commit = on\n",
                    conf_escape(&name),
                ))?;
                reload(primary)?;
            }
            let what = format!(
                "standby {name:?} reported as the synchronous standby of {:?}",
                primary.name()
            );
            let sql = format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{}'",
                name.replace('\'', "''")
            );
            wait_until(primary, &what, || {
                let state = query::text(&primary.url("postgres"), &sql)?;
                Ok(state.as_deref() == Some("sync"))
            })?;
        }
        tracing::info!(
            standby = %name,
            port = self.cluster.port(),
            replication = ?self.replication,
            "the standby streams"
        );
        Ok(())
    }

    fn shut_down(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let mut first_error = None;
        let mut note = |result: Result<()>| {
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        };
        note(self.cluster.lock().and_then(|_lock| {
            // A fast stop, and an immediate one if the fast one fails.
            self.cluster
                .stop_locked(StopMode::Fast)
                .or_else(|_| self.cluster.stop_locked(StopMode::Immediate))?;
            remove_dir(self.cluster.data_dir())
        }));
        if self.replication == Replication::Synchronous {
            let primary = self.primary;
            note(primary.lock().and_then(|_lock| {
                primary.write_settings("")?;
                match primary.postmaster() {
                    Postmaster::Ours { .. } => reload(primary),
                    Postmaster::Absent | Postmaster::Stale => Ok(()),
                }
            }));
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Standby<'_> {
    /// Stops the standby (see [`Standby::stop`]); errors are logged.
    fn drop(&mut self) {
        if let Err(error) = self.shut_down() {
            tracing::warn!(
                standby = %self.cluster.name(),
                %error,
                "could not clean the standby up"
            );
        }
    }
}

/// `pg_ctl reload`: the server rereads its settings.
fn reload(cluster: &Cluster) -> Result<()> {
    cluster.run(
        "pg_ctl reload",
        "pg_ctl",
        [
            OsStr::new("reload"),
            OsStr::new("-D"),
            cluster.data_dir().as_os_str(),
            OsStr::new("-s"),
        ],
        None,
    )
}

/// Asks `ready` every 50 ms until it says yes, for at most 60 s. A question that fails
/// counts as no (the server may be starting); the last failure is in the timeout error.
fn wait_until(
    cluster: &Cluster,
    what: &str,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let log_offset = cluster.log_len();
    let deadline = Instant::now() + WAIT;
    let mut last_error = None;
    loop {
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => last_error = Some(error),
        }
        if Instant::now() >= deadline {
            let mut log = cluster.log_tail(log_offset);
            if let Some(error) = last_error {
                log.push_str(&format!("\n(the last check failed: {error})"));
            }
            return Err(Error::Timeout {
                what: what.to_owned(),
                waited: WAIT,
                log_file: cluster.log_file().display().to_string(),
                log,
            });
        }
        thread::sleep(POLL);
    }
}

/// Removes `dir` and everything in it; a missing one is fine.
fn remove_dir(dir: &std::path::Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(Error::Io {
            context: format!("removing {}", dir.display()),
            source: error,
        }),
        _ => Ok(()),
    }
}
