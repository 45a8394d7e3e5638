//! One server backend killed on purpose: what the OOM killer does to a PostgreSQL backend.
//! The postmaster then terminates every other session, runs crash recovery and accepts
//! connections again — without restarting itself, so `pg_postmaster_start_time()` stays the
//! same. The fault suite (`cargo xtask chaos --scenario backend-crash`) uses it.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::cluster::Cluster;
use crate::error::{Error, Result};

impl Cluster {
    /// Sends SIGKILL to server backend `pid` of this cluster. Refuses, naming the reason, a
    /// pid that is the postmaster itself, or is not a child of this cluster's running
    /// postmaster (another cluster's backend, a reused pid, a client). Returns once the
    /// signal was sent; the caller waits for the server to come back from recovery.
    pub fn kill_backend(&self, pid: u32) -> Result<()> {
        let invalid = |reason: String| Error::Invalid {
            what: format!("backend pid {pid} of cluster {:?}", self.name()),
            reason,
        };
        let pid_file = self.data_dir().join("postmaster.pid");
        let postmaster: u32 = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse().ok())
            .ok_or_else(|| {
                invalid(format!(
                    "no server runs ({} is missing)",
                    pid_file.display()
                ))
            })?;
        if pid == postmaster {
            return Err(invalid(
                "it is the postmaster; only a backend may be killed".to_owned(),
            ));
        }
        match parent_of(pid) {
            Some(parent) if parent == postmaster => {}
            Some(parent) => {
                return Err(invalid(format!(
                    "its parent is process {parent}, not the postmaster {postmaster}"
                )))
            }
            None => return Err(invalid("no such process".to_owned())),
        }
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdin(Stdio::null())
            .status()
            .map_err(Error::io(format!("running kill -KILL {pid}")))?;
        if !status.success() {
            return Err(Error::Command {
                what: format!("kill -KILL {pid} (a backend of cluster {:?})", self.name()),
                status: status.to_string(),
                output: String::new(),
            });
        }
        tracing::info!(cluster = %self.name(), pid, "killed a server backend (SIGKILL)");
        Ok(())
    }
}

/// The parent pid of `pid`, from `/proc/<pid>/stat` (the field after the parenthesised
/// command name, which may itself contain spaces or parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    parse_parent(&stat)
}

fn parse_parent(stat: &str) -> Option<u32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_pid_is_read_after_the_command_name() {
        assert_eq!(
            parse_parent("4242 (postgres: a (b) c) S 4200 4200 4200 0 -1"),
            Some(4200)
        );
        assert_eq!(parse_parent("garbage"), None);
    }

    #[test]
    fn this_process_has_a_parent() {
        assert!(parent_of(std::process::id()).is_some());
    }
}
