//! The one error type of this crate: each variant is something the caller can act on.

use std::io;
use std::time::Duration;

/// What went wrong while providing a throwaway PostgreSQL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No PostgreSQL server installation (`initdb`, `pg_ctl`, `postgres`) was found.
    #[error(
        "the PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found; searched {searched}. \
         On Debian/Ubuntu `apt-get update && apt-get install -y postgresql` installs them. \
         Alternatively set DATABASE_URL to a server where the user may CREATE DATABASE"
    )]
    BinariesNotFound {
        /// The places looked in, in order.
        searched: String,
    },

    /// A program the operation needs (`pg_basebackup` for a standby) is missing from the
    /// installation whose `initdb`, `pg_ctl` and `postgres` run the clusters.
    #[error(
        "{program} was not found in {bin_dir}, beside the initdb that runs the clusters; \
         it ships with PostgreSQL's client programs \
         (Debian/Ubuntu: `apt-get install -y postgresql-client`, or the server package)"
    )]
    ProgramMissing {
        /// The program, e.g. `pg_basebackup`.
        program: String,
        /// The directory searched.
        bin_dir: String,
    },

    /// A server did not reach a state in time (a standby streaming, a promotion finishing).
    #[error("{what}: not so after {} s; the end of {log_file}:\n{log}", .waited.as_secs())]
    Timeout {
        /// The state waited for, e.g. `standby "chaos-standby" streaming from "chaos"`.
        what: String,
        /// How long it was waited for.
        waited: Duration,
        /// The server log.
        log_file: String,
        /// Its last lines.
        log: String,
    },

    /// Running as root, which PostgreSQL refuses, and there is no `postgres` OS user to run
    /// the server as instead.
    #[error(
        "running as root, and PostgreSQL refuses to run as root, but there is no `postgres` OS user \
         to run it as. Installing the server package creates that user \
         (Debian/Ubuntu: `apt-get install -y postgresql`); or run as an ordinary user; \
         or set DATABASE_URL to a server where the user may CREATE DATABASE"
    )]
    NoPostgresUser,

    /// A command (`initdb`, `pg_ctl`, `chown`, ...) failed. `output` holds what it printed
    /// and, for the server, the tail of its log.
    #[error("{what} failed ({status}):\n{output}")]
    Command {
        /// The command and its purpose, e.g. `pg_ctl start (cluster "test")`.
        what: String,
        /// How it ended, e.g. `exit status: 1`.
        status: String,
        /// Its stdout and stderr, and the tail of the server log where that helps.
        output: String,
    },

    /// The server did not accept a connection.
    #[error(
        "connecting to {url}: {source}. Is the server up? (`cargo xtask pg status`; \
         if DATABASE_URL is set, check it)"
    )]
    Connect {
        /// The URL tried, with any password masked.
        url: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },

    /// The server refused a statement, e.g. `CREATE DATABASE` by a user without `CREATEDB`.
    #[error("{context}: {source}")]
    Database {
        /// What was being done, e.g. `creating database wp_...`.
        context: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },

    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path involved.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A caller-supplied value was unusable.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which value, e.g. `cluster name "a b"`.
        what: String,
        /// Why, and what would be accepted.
        reason: String,
    },

    /// A running process belongs to the cluster's data directory but does not accept
    /// connections on the cluster's socket (shutting down, hung, or started by hand with
    /// other settings).
    #[error(
        "a PostgreSQL server (pid {pid}) runs on {data_dir} but does not accept connections on its \
         socket; stop it (`cargo xtask pg stop`, or `pg_ctl stop -D {data_dir}`) and retry"
    )]
    Unresponsive {
        /// The postmaster's process id, from `postmaster.pid`.
        pid: u32,
        /// The cluster's data directory.
        data_dir: String,
    },
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] with its context.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_say_how_to_install_them_or_what_else_to_do() {
        let message = Error::BinariesNotFound {
            searched: "$PATH".to_owned(),
        }
        .to_string();
        assert!(message.contains("initdb, pg_ctl, postgres"));
        assert!(message.contains("apt-get update && apt-get install -y postgresql"));
        assert!(message.contains("DATABASE_URL"));
    }

    #[test]
    fn a_missing_pg_basebackup_says_where_it_was_looked_for_and_how_to_install_it() {
        let message = Error::ProgramMissing {
            program: "pg_basebackup".to_owned(),
            bin_dir: "/usr/lib/postgresql/15/bin".to_owned(),
        }
        .to_string();
        assert!(message.starts_with("pg_basebackup was not found in /usr/lib/postgresql/15/bin"));
        assert!(message.contains("apt-get install -y postgresql-client"));
    }
}
