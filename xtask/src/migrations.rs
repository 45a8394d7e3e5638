//! `cargo xtask migrations check | release`: a released migration is never edited.
//!
//! `sql/released-migrations.sha384` lists every migration of a published release with its
//! checksum: SHA-384 of the file's bytes, the checksum sqlx records in `_sqlx_migrations` and
//! compares on every `migrate` (a store migrated by a release refuses a binary whose embedded
//! copy of an applied migration differs). `check` fails when a listed file is gone or its
//! content differs, and says how many it verified; migrations not listed yet are the next
//! release's and may still change (docs/store.md, "Changing a function"). `release` appends
//! the migrations not yet listed, after a passing check: run it once per release
//! (CONTRIBUTING.md, "Releasing").

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sha2::{Digest, Sha384};

use crate::Outcome;

/// The manifest, relative to the workspace root.
pub(crate) const MANIFEST: &str = "sql/released-migrations.sha384";
/// The migrations, relative to the workspace root.
pub(crate) const MIGRATIONS: &str = "sql/migrations";

/// `cargo xtask migrations`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Fail when a migration listed in sql/released-migrations.sha384 was edited or removed
    Check,
    /// At a release: check, then append every migration not listed yet to the manifest
    Release,
}

pub(crate) fn run(Args { action }: Args) -> Outcome {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let store = Released {
        manifest: root.join(MANIFEST),
        migrations: root.join(MIGRATIONS),
    };
    match action {
        Action::Check => match store.check() {
            Ok(verified) => {
                let pending = store.unlisted()?.len();
                println!(
                    "migrations: {verified} released migration(s) verified unchanged against \
                     {MANIFEST}; {pending} not released yet (free to change until the release)"
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(problems) => {
                for problem in &problems {
                    eprintln!("error: {problem}");
                }
                eprintln!(
                    "a released migration is never edited: restore it, and put the change in a \
                     new migration that restates the function (docs/store.md, \"Changing a \
                     function\")"
                );
                Ok(ExitCode::FAILURE)
            }
        },
        Action::Release => {
            let added = store.release()?;
            for name in &added {
                println!("released {name}");
            }
            println!(
                "migrations: {} migration(s) added to {MANIFEST}; commit it with the release",
                added.len()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A manifest and the migrations directory it speaks of.
pub(crate) struct Released {
    pub(crate) manifest: PathBuf,
    pub(crate) migrations: PathBuf,
}

/// One line of the manifest: a file name in the migrations directory and its checksum.
struct Entry {
    line: usize,
    checksum: String,
    name: String,
}

impl Released {
    /// Verifies every listed migration: the number verified, or every problem found.
    pub(crate) fn check(&self) -> Result<usize, Vec<String>> {
        let entries = self.entries().map_err(|problem| vec![problem])?;
        let mut problems = Vec::new();
        for entry in &entries {
            let path = self.migrations.join(&entry.name);
            match fs::read(&path) {
                Err(error) => problems.push(format!(
                    "{} (released, {}:{}) cannot be read: {error}",
                    path.display(),
                    self.manifest.display(),
                    entry.line
                )),
                Ok(bytes) => {
                    let actual = checksum(&bytes);
                    if actual != entry.checksum {
                        problems.push(format!(
                            "{} was edited after its release: its checksum is {actual}, \
                             {}:{} recorded {}",
                            path.display(),
                            self.manifest.display(),
                            entry.line,
                            entry.checksum
                        ));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(entries.len())
        } else {
            Err(problems)
        }
    }

    /// The migration files not listed in the manifest, by name.
    pub(crate) fn unlisted(&self) -> Result<Vec<String>, String> {
        let listed: Vec<String> = self.entries()?.into_iter().map(|e| e.name).collect();
        Ok(self
            .files()?
            .into_iter()
            .filter(|name| !listed.contains(name))
            .collect())
    }

    /// Checks, then appends every unlisted migration; returns their names.
    pub(crate) fn release(&self) -> Result<Vec<String>, String> {
        self.check().map_err(|problems| problems.join("\n"))?;
        let added = self.unlisted()?;
        let mut text = fs::read_to_string(&self.manifest)
            .map_err(|error| format!("{}: {error}", self.manifest.display()))?;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for name in &added {
            let path = self.migrations.join(name);
            let bytes = fs::read(&path).map_err(|error| format!("{}: {error}", path.display()))?;
            let _ = writeln!(text, "{}  {name}", checksum(&bytes));
        }
        fs::write(&self.manifest, text)
            .map_err(|error| format!("{}: {error}", self.manifest.display()))?;
        Ok(added)
    }

    /// The manifest's entries; `#` lines and blank lines are comments.
    fn entries(&self) -> Result<Vec<Entry>, String> {
        let text = fs::read_to_string(&self.manifest).map_err(|error| {
            format!(
                "{} cannot be read: {error} (it lists the released migrations; \
                 an empty file before the first release)",
                self.manifest.display()
            )
        })?;
        let mut entries: Vec<Entry> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let at = format!("{}:{line}", self.manifest.display());
            let Some((checksum, name)) = content.split_once("  ") else {
                return Err(format!(
                    "{at}: expected `<sha384 hex>  <file name>`, found {content:?}"
                ));
            };
            let (checksum, name) = (checksum.trim(), name.trim());
            if checksum.len() != 96 || !checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "{at}: {checksum:?} is not a SHA-384 checksum (96 hex digits)"
                ));
            }
            if !is_migration_name(name) {
                return Err(format!(
                    "{at}: {name:?} is not a migration file name (NNNN_name.sql, no directory)"
                ));
            }
            if entries.iter().any(|e| e.name == name) {
                return Err(format!("{at}: {name} is listed twice"));
            }
            entries.push(Entry {
                line,
                checksum: checksum.to_ascii_lowercase(),
                name: name.to_owned(),
            });
        }
        Ok(entries)
    }

    /// The migration files, sorted by name.
    fn files(&self) -> Result<Vec<String>, String> {
        let dir = fs::read_dir(&self.migrations)
            .map_err(|error| format!("{}: {error}", self.migrations.display()))?;
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|error| format!("{}: {error}", self.migrations.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_migration_name(&name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}

/// `NNNN_name.sql`, a plain file name.
fn is_migration_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".sql") else {
        return false;
    };
    let Some((number, rest)) = stem.split_once('_') else {
        return false;
    };
    !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
        && !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// SHA-384 of the file, lower-case hex: the checksum sqlx records for a migration.
fn checksum(bytes: &[u8]) -> String {
    Sha384::digest(bytes)
        .iter()
        .fold(String::with_capacity(96), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the repository's migrations and an empty manifest, in a temporary directory.
    fn copy_of_the_migrations() -> (tempfile::TempDir, Released) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let migrations = dir.path().join("migrations");
        fs::create_dir(&migrations).expect("create migrations/");
        for entry in fs::read_dir(root.join(MIGRATIONS)).expect("sql/migrations") {
            let entry = entry.expect("an entry");
            fs::copy(entry.path(), migrations.join(entry.file_name())).expect("copy");
        }
        let manifest = dir.path().join("released-migrations.sha384");
        fs::write(&manifest, "# released migrations\n").expect("write the manifest");
        (
            dir,
            Released {
                manifest,
                migrations,
            },
        )
    }

    #[test]
    fn the_repository_manifest_matches_its_migrations() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let released = Released {
            manifest: root.join(MANIFEST),
            migrations: root.join(MIGRATIONS),
        };
        released
            .check()
            .expect("every released migration unchanged");
    }

    #[test]
    fn the_checksum_is_the_one_sqlx_records() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join(MIGRATIONS).join("0001_tables.sql");
        let bytes = fs::read(&path).expect("0001_tables.sql");
        let sql = String::from_utf8(bytes.clone()).expect("UTF-8");
        let migration = sqlx::migrate::Migration::new(
            1,
            "tables".into(),
            sqlx::migrate::MigrationType::Simple,
            sql.into(),
            false,
        );
        assert_eq!(checksum(&bytes), checksum_hex(&migration.checksum));
    }

    fn checksum_hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn an_empty_manifest_verifies_nothing_and_leaves_every_migration_unreleased() {
        let (_dir, released) = copy_of_the_migrations();
        assert_eq!(released.check(), Ok(0));
        let files = released.files().expect("the migrations");
        assert!(!files.is_empty());
        assert_eq!(released.unlisted().expect("unlisted"), files);
    }

    #[test]
    fn release_lists_every_migration_and_check_then_verifies_them_all() {
        let (_dir, released) = copy_of_the_migrations();
        let files = released.files().expect("the migrations");
        assert_eq!(released.release().expect("release"), files);
        assert_eq!(released.check(), Ok(files.len()));
        assert!(released.unlisted().expect("unlisted").is_empty());
        // A second release adds only what is new.
        fs::write(released.migrations.join("9999_next.sql"), "SELECT 1;\n")
            .expect("a new migration");
        assert_eq!(released.check(), Ok(files.len()));
        assert_eq!(
            released.release().expect("release"),
            ["9999_next.sql".to_owned()]
        );
        assert_eq!(released.check(), Ok(files.len() + 1));
    }

    #[test]
    fn an_edited_released_migration_fails_the_check_naming_the_file() {
        let (_dir, released) = copy_of_the_migrations();
        let files = released.release().expect("release");
        let edited = &files[files.len() / 2];
        let path = released.migrations.join(edited);
        let mut sql = fs::read_to_string(&path).expect("read");
        sql.push_str("-- one more comment\n");
        fs::write(&path, sql).expect("edit");

        let problems = released.check().expect_err("an edited migration fails");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains(edited.as_str()), "{problems:?}");
        assert!(
            problems[0].contains("was edited after its release"),
            "{problems:?}"
        );
        // And release refuses to record anything over it.
        assert!(released.release().is_err());
    }

    #[test]
    fn a_removed_released_migration_fails_the_check_naming_the_file() {
        let (_dir, released) = copy_of_the_migrations();
        let files = released.release().expect("release");
        fs::remove_file(released.migrations.join(&files[0])).expect("remove");

        let problems = released.check().expect_err("a missing migration fails");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains(files[0].as_str()), "{problems:?}");
        assert!(problems[0].contains("cannot be read"), "{problems:?}");
    }

    #[test]
    fn a_malformed_manifest_line_is_refused_with_its_line_number() {
        let (_dir, released) = copy_of_the_migrations();
        for (line, problem) in [
            ("0001_tables.sql", "expected `<sha384 hex>  <file name>`"),
            ("abc  0001_tables.sql", "is not a SHA-384 checksum"),
            (
                &format!("{}  ../0001_tables.sql", "0".repeat(96)),
                "is not a migration file name",
            ),
        ] {
            fs::write(&released.manifest, format!("# header\n{line}\n")).expect("write");
            let problems = released.check().expect_err(line);
            assert!(problems[0].contains(":2:"), "{problems:?}");
            assert!(problems[0].contains(problem), "{problems:?}");
        }
    }
}
