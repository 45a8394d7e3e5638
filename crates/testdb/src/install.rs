//! Finding a PostgreSQL server installation: `$PATH`, then `pg_config --bindir`, then the
//! highest version under `/usr/lib/postgresql/*/bin` (Debian/Ubuntu's layout).

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The programs a cluster needs; all must live in one directory.
const SERVER_PROGRAMS: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Debian/Ubuntu install each major version under its own directory here.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// One PostgreSQL installation's binaries.
#[derive(Debug, Clone)]
pub(crate) struct Install {
    /// Holds `initdb`, `pg_ctl`, `postgres`, and usually `pgbench`, `pg_config`, `psql`.
    pub(crate) bin_dir: PathBuf,
}

impl Install {
    /// Looks in `$PATH`, then `pg_config --bindir`, then `/usr/lib/postgresql/*/bin`.
    pub(crate) fn find() -> Result<Install> {
        let mut searched = Vec::new();

        if let Some(path) = env::var_os("PATH") {
            if let Some(bin_dir) = env::split_paths(&path).find_map(|dir| server_bin_dir(&dir)) {
                return Ok(Install { bin_dir });
            }
        }
        searched.push("$PATH".to_owned());

        match command_line(Command::new("pg_config").arg("--bindir")) {
            Some(dir) => match server_bin_dir(Path::new(&dir)) {
                Some(bin_dir) => return Ok(Install { bin_dir }),
                None => searched.push(format!("`pg_config --bindir` ({dir})")),
            },
            None => searched.push("`pg_config --bindir` (no pg_config on $PATH)".to_owned()),
        }

        let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(DEBIAN_ROOT)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = parse_version(&entry.file_name())?;
                Some((version, entry.path().join("bin")))
            })
            .collect();
        versions.sort();
        if let Some(bin_dir) = versions
            .iter()
            .rev()
            .find_map(|(_, dir)| server_bin_dir(dir))
        {
            return Ok(Install { bin_dir });
        }
        searched.push(format!("{DEBIAN_ROOT}/*/bin"));

        Err(Error::BinariesNotFound {
            searched: searched.join(", "),
        })
    }

    /// The path of one of this installation's programs.
    pub(crate) fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// Whether the server can load extension `name`: its control file is in the share
    /// directory that belongs to these binaries.
    pub(crate) fn has_extension(&self, name: &str) -> bool {
        let control = format!("{name}.control");
        self.share_dirs()
            .iter()
            .any(|dir| dir.join("extension").join(&control).is_file())
    }

    /// Candidate share directories, most reliable first.
    fn share_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        // pg_config beside the binaries knows exactly.
        if let Some(dir) = command_line(Command::new(self.program("pg_config")).arg("--sharedir")) {
            dirs.push(PathBuf::from(dir));
        }
        if let Some(prefix) = self.bin_dir.parent() {
            // Source and most package installs: <prefix>/share[/postgresql].
            dirs.push(prefix.join("share"));
            dirs.push(prefix.join("share").join("postgresql"));
            // Debian: /usr/lib/postgresql/15/bin pairs with /usr/share/postgresql/15.
            if let Some(major) = prefix.file_name() {
                dirs.push(Path::new("/usr/share/postgresql").join(major));
            }
        }
        dirs
    }
}

/// `dir` if it holds all server programs. A symlinked `initdb` (e.g. `/usr/local/bin/initdb`
/// pointing into `/usr/lib/postgresql/15/bin`) is followed to the installation it belongs to,
/// so that the result also holds that installation's `pgbench`, `pg_config` and friends.
fn server_bin_dir(dir: &Path) -> Option<PathBuf> {
    let initdb = dir.join("initdb");
    if !is_executable(&initdb) {
        return None;
    }
    if let Some(real_dir) = initdb.canonicalize().ok().as_deref().and_then(Path::parent) {
        if has_server_programs(real_dir) {
            return Some(real_dir.to_owned());
        }
    }
    has_server_programs(dir).then(|| dir.to_owned())
}

fn has_server_programs(dir: &Path) -> bool {
    SERVER_PROGRAMS
        .iter()
        .all(|program| is_executable(&dir.join(program)))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `15` → `[15]`, `9.6` → `[9, 6]`; anything else is not a version directory.
fn parse_version(name: &OsStr) -> Option<Vec<u32>> {
    name.to_str()?
        .split('.')
        .map(|part| part.parse().ok())
        .collect()
}

/// The first line a command prints, if it runs and succeeds.
fn command_line(command: &mut Command) -> Option<String> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let line = String::from_utf8(output.stdout).ok()?;
    let line = line.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_directories_sort_numerically() {
        let mut versions: Vec<Vec<u32>> = ["9.6", "15", "10", "16"]
            .iter()
            .filter_map(|name| parse_version(OsStr::new(name)))
            .collect();
        versions.sort();
        assert_eq!(versions, vec![vec![9, 6], vec![10], vec![15], vec![16]]);
    }

    #[test]
    fn non_version_directories_are_ignored() {
        assert_eq!(parse_version(OsStr::new("common")), None);
        assert_eq!(parse_version(OsStr::new("15beta")), None);
    }
}
