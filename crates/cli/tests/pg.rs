//! `workpump` run as a process against a fresh database on the test PostgreSQL: what it
//! prints, what it changes, and its exit code.

use std::process::Output;

use serde_json::Value;
use sqlx::PgPool;
use workpump_coordinator::testing::fresh_database;

/// Runs `workpump` with `args`, without the caller's DATABASE_URL.
fn workpump(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_workpump"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("WORKPUMP_SCHEMA")
        .output()
        .expect("run workpump")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Its exit code and stdout, stderr shown when it is not the one expected.
fn expect_code(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

async fn schema_exists(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'workpump')")
        .fetch_one(pool)
        .await
        .expect("read the catalog")
}

#[tokio::test]
async fn migrate_dry_run_lists_every_migration_pending_and_changes_nothing_then_migrate_applies_them(
) {
    let (db, pool) = fresh_database().await;
    let shipped = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/migrations"))
        .expect("the migrations")
        .count();
    assert!(shipped >= 24, "{shipped} migrations");

    let dry = workpump(&["migrate", "--dry-run", "--json", "--database-url", db.url()]);
    let report: Value = serde_json::from_str(&expect_code(&dry, 0)).expect("json");
    assert_eq!(report["dry_run"], true);
    assert_eq!(
        report["applied"].as_array().expect("applied").len(),
        shipped
    );
    let states: Vec<&str> = report["migrations"]
        .as_array()
        .expect("migrations")
        .iter()
        .map(|m| m["state"].as_str().expect("state"))
        .collect();
    assert_eq!(states, vec!["pending"; shipped]);
    assert!(!schema_exists(&pool).await, "a dry run created the schema");

    let table = expect_code(
        &workpump(&["migrate", "--dry-run", "--database-url", db.url()]),
        0,
    );
    assert!(table.starts_with("version  migration"), "{table}");
    assert!(table.contains("0001     tables"), "{table}");
    assert!(
        table.contains(&format!("would apply {shipped} migration(s)")),
        "{table}"
    );

    let run = workpump(&["migrate", "--database-url", db.url()]);
    let printed = expect_code(&run, 0);
    assert!(
        printed.contains(&format!("applied {shipped} migration(s)")),
        "{printed}"
    );
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump._sqlx_migrations")
        .fetch_one(&pool)
        .await
        .expect("sqlx's table");
    assert_eq!(applied as usize, shipped);

    let again = workpump(&["migrate", "--json", "--database-url", db.url()]);
    let report: Value = serde_json::from_str(&expect_code(&again, 0)).expect("json");
    assert_eq!(report["applied"], Value::Array(vec![]));
    assert!(report["migrations"]
        .as_array()
        .expect("migrations")
        .iter()
        .all(|m| m["state"] == "applied" && m["installed_on"].is_string()));
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_migration_changed_after_it_was_applied_stops_migrate_with_exit_code_4() {
    let (db, pool) = fresh_database().await;
    expect_code(&workpump(&["migrate", "--database-url", db.url()]), 0);
    sqlx::query("UPDATE workpump._sqlx_migrations SET checksum = '\\x00' WHERE version = 5")
        .execute(&pool)
        .await
        .expect("tamper with a checksum");
    let out = workpump(&["migrate", "--database-url", db.url()]);
    expect_code(&out, 4);
    let err = text(&out.stderr);
    assert!(err.contains("migration 5 (claim work)"), "{err}");
    assert!(err.contains("nothing was migrated"), "{err}");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn grants_are_printed_for_the_role_and_applied_only_to_a_role_that_exists() {
    let (db, pool) = fresh_database().await;
    expect_code(&workpump(&["migrate", "--database-url", db.url()]), 0);

    let printed = expect_code(
        &workpump(&["grants", "--role", "app_worker", "--database-url", db.url()]),
        0,
    );
    assert!(
        printed.contains("GRANT USAGE ON SCHEMA \"workpump\" TO \"app_worker\";"),
        "{printed}"
    );

    let role = format!("wp_cli_{}", std::process::id());
    let missing = workpump(&[
        "grants",
        "--role",
        &role,
        "--apply",
        "--database-url",
        db.url(),
    ]);
    expect_code(&missing, 1);
    assert!(
        text(&missing.stderr).contains("does not exist"),
        "{}",
        text(&missing.stderr)
    );

    sqlx::query(&format!("CREATE ROLE {role} NOLOGIN"))
        .execute(&pool)
        .await
        .expect("create a role (the test server's user needs CREATEROLE)");
    let applied = workpump(&[
        "grants",
        "--role",
        &role,
        "--apply",
        "--database-url",
        db.url(),
    ]);
    expect_code(&applied, 0);
    let may: bool = sqlx::query_scalar(
        "SELECT has_table_privilege($1, 'workpump.work', 'INSERT')
            AND has_function_privilege($1, 'workpump.claim_work(uuid, text[], integer, interval)', 'EXECUTE')",
    )
    .bind(&role)
    .fetch_one(&pool)
    .await
    .expect("read the privileges");
    assert!(may, "the grants were not applied");
    sqlx::raw_sql(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .execute(&pool)
        .await
        .expect("drop the role");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn without_a_database_or_with_one_nobody_serves_it_says_what_to_do() {
    let none = workpump(&["migrate"]);
    expect_code(&none, 2);
    assert!(
        text(&none.stderr).contains("pass --database-url or set DATABASE_URL"),
        "{}",
        text(&none.stderr)
    );

    let closed = workpump(&[
        "migrate",
        "--database-url",
        "postgres://nobody@127.0.0.1:1/none?connect_timeout=2",
    ]);
    expect_code(&closed, 3);
    let err = text(&closed.stderr);
    assert!(err.contains("hint: check --database-url"), "{err}");

    let server = workpump_testdb::server()
        .await
        .expect("the test PostgreSQL");
    let missing = workpump(&[
        "migrate",
        "--database-url",
        &server.url_for("wp_no_such_database"),
    ]);
    expect_code(&missing, 3);
    let err = text(&missing.stderr);
    assert!(
        err.contains("wp_no_such_database") && err.contains("does not exist"),
        "{err}"
    );

    let bad = workpump(&[
        "migrate",
        "--schema",
        "Bad-Name",
        "--database-url",
        "postgres://x@127.0.0.1:1/none",
    ]);
    expect_code(&bad, 2);
    assert!(
        text(&bad.stderr).contains("Bad-Name"),
        "{}",
        text(&bad.stderr)
    );
}
