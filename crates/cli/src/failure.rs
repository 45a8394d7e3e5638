//! Why a command failed, what to do about it, and the exit code that says which kind of
//! failure it was.

use std::fmt;

use workpump_coordinator::Error;

/// The exit code of a failed command (0 is success).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExitCode {
    /// 1: the store refused (an unknown id or queue, a state that does not allow it).
    Refused = 1,
    /// 2: a bad argument or option (clap exits 2 for its own usage errors too).
    Usage = 2,
    /// 3: the database could not be reached or refused the session.
    Unreachable = 3,
    /// 4: the schema is not ready (not migrated, a migration changed, the lock held).
    Schema = 4,
}

/// A failed command: what went wrong and what to do.
#[derive(Debug)]
pub(crate) struct Failure {
    code: ExitCode,
    message: String,
    hint: Option<String>,
}

/// SQLSTATEs that mean the schema (or an object in it) is missing: not migrated.
const MISSING_OBJECT: [&str; 3] = ["3F000", "42P01", "42883"];
/// SQLSTATE classes of a connection that failed or was refused: connection exceptions,
/// invalid authorization, invalid catalog name (no such database).
const UNREACHABLE_CLASSES: [&str; 3] = ["08", "28", "3D"];

impl Failure {
    pub(crate) fn new(code: ExitCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            hint: None,
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure::new(ExitCode::Usage, message)
    }

    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn exit_code(&self) -> std::process::ExitCode {
        std::process::ExitCode::from(self.code as u8)
    }

    /// A store error, classified, with what to do about it.
    pub(crate) fn from_store(e: Error) -> Failure {
        match &e {
            Error::NotFound { .. } | Error::InvalidState { .. } | Error::UnknownQueue(_) => {
                Failure::new(ExitCode::Refused, e.to_string())
            }
            Error::InvalidArgument(_) => Failure::usage(e.to_string()),
            Error::MigrationLocked { .. } => Failure::new(ExitCode::Schema, e.to_string())
                .with_hint(
                    "wait for the other migrator, or end its session (pg_terminate_backend(pid))",
                ),
            Error::Database { source, .. } => {
                let state = source
                    .downcast_ref::<sqlx::Error>()
                    .and_then(|s| s.as_database_error())
                    .and_then(|d| d.code().map(|c| c.into_owned()));
                match state.as_deref() {
                    Some(s) if MISSING_OBJECT.contains(&s) => {
                        Failure::new(ExitCode::Schema, e.to_string()).with_hint(
                            "the schema is not migrated (or is another version): run `workpump migrate` as the migrator role, or check --schema",
                        )
                    }
                    Some("42501") => Failure::new(ExitCode::Refused, e.to_string()).with_hint(
                        "the role lacks a privilege: connect as the migrator, or apply `workpump grants --role <runtime role> --apply`",
                    ),
                    Some(s) if !UNREACHABLE_CLASSES.iter().any(|c| s.starts_with(c)) => {
                        Failure::new(ExitCode::Refused, e.to_string())
                    }
                    _ => Failure::new(ExitCode::Unreachable, e.to_string()).with_hint(
                        "check --database-url (or DATABASE_URL), that the server is up, and the role and password",
                    ),
                }
            }
            _ => Failure::new(ExitCode::Refused, e.to_string()),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "workpump: {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}
