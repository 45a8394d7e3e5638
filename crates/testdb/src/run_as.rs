//! Running the server's programs as a user PostgreSQL accepts. `initdb` and `postgres` refuse
//! to run as root, so as root they run as the `postgres` OS user (which the Debian/Ubuntu
//! server package creates), via `runuser`, or `su` where there is no `runuser`.

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The OS user the server runs as when we are root.
const SERVER_USER: &str = "postgres";

/// Who runs the server's programs.
#[derive(Debug, Clone)]
pub(crate) enum RunAs {
    /// This process's own user (not root).
    Me,
    /// The `postgres` OS user, because we are root.
    ServerUser(Switch),
}

/// How root becomes the server user.
#[derive(Debug, Clone)]
pub(crate) enum Switch {
    /// `runuser -u postgres -- <program> <args>`
    Runuser(PathBuf),
    /// `su postgres -s /bin/sh -c '<program> <args>'`
    Su(PathBuf),
}

impl RunAs {
    /// [`RunAs::Me`] unless the effective user is root.
    pub(crate) fn detect() -> Result<RunAs> {
        if !effective_user_is_root() {
            return Ok(RunAs::Me);
        }
        let user_exists = Command::new("id")
            .args(["-u", SERVER_USER])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !user_exists {
            return Err(Error::NoPostgresUser);
        }
        if let Some(runuser) = find_program("runuser") {
            return Ok(RunAs::ServerUser(Switch::Runuser(runuser)));
        }
        if let Some(su) = find_program("su") {
            return Ok(RunAs::ServerUser(Switch::Su(su)));
        }
        Err(Error::Command {
            what: format!("switching from root to the `{SERVER_USER}` user"),
            status: "neither runuser nor su found".to_owned(),
            output: "install util-linux (runuser) or login (su), or run as an ordinary user"
                .to_owned(),
        })
    }

    /// A command running `program args...` as the right user.
    pub(crate) fn command<I, S>(&self, program: &Path, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args
            .into_iter()
            .map(|arg| arg.as_ref().to_owned())
            .collect();
        match self {
            RunAs::Me => {
                let mut command = Command::new(program);
                command.args(args);
                command
            }
            RunAs::ServerUser(Switch::Runuser(runuser)) => {
                let mut command = Command::new(runuser);
                command
                    .args(["-u", SERVER_USER, "--"])
                    .arg(program)
                    .args(args);
                command
            }
            RunAs::ServerUser(Switch::Su(su)) => {
                let mut script = shell_quote(program.as_os_str());
                for arg in &args {
                    script.push(' ');
                    script.push_str(&shell_quote(arg));
                }
                let mut command = Command::new(su);
                command
                    .args([SERVER_USER, "-s", "/bin/sh", "-c"])
                    .arg(script);
                command
            }
        }
    }

    /// Whether the server user can reach `dir` — or, if it does not exist yet, its nearest
    /// existing ancestor. A project under `/root` (mode 700) is out of reach.
    pub(crate) fn can_reach(&self, dir: &Path) -> bool {
        if matches!(self, RunAs::Me) {
            return true;
        }
        let Some(existing) = dir.ancestors().find(|dir| dir.exists()) else {
            return false;
        };
        let test = Path::new("test");
        self.command(test, [OsStr::new("-x"), existing.as_os_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Makes `path` (recursively) the server user's. A no-op for [`RunAs::Me`].
    pub(crate) fn hand_over(&self, path: &Path) -> Result<()> {
        if matches!(self, RunAs::Me) {
            return Ok(());
        }
        let output = Command::new("chown")
            .arg("-R")
            .arg(format!("{SERVER_USER}:"))
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .map_err(Error::io(format!(
                "running chown -R {SERVER_USER}: {}",
                path.display()
            )))?;
        if output.status.success() {
            return Ok(());
        }
        Err(Error::Command {
            what: format!("chown -R {SERVER_USER}: {}", path.display()),
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Reads the effective uid from `/proc/self/status`, else asks `id -u`.
fn effective_user_is_root() -> bool {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        // "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
        if let Some(effective) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
        {
            return effective == "0";
        }
    }
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
}

/// `name` in `$PATH`, or in the sbin directories a non-login root shell may lack.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `arg` as one word for `/bin/sh`.
fn shell_quote(arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    let mut quoted = String::with_capacity(arg.len() + 2);
    quoted.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_single_quotes_and_spaces() {
        assert_eq!(shell_quote(OsStr::new("/a b/c")), "'/a b/c'");
        assert_eq!(shell_quote(OsStr::new("it's")), "'it'\\''s'");
    }
}
