//! `workpump` run as a process against a fresh database on the test PostgreSQL: what it
//! prints, what it changes, and its exit code.

use std::process::Output;

use serde_json::Value;
use sqlx::PgPool;
use workpump_coordinator::testing::fresh_database;
use workpump_coordinator::Operations;

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
            AND has_function_privilege($1, 'workpump.claim_work(uuid, text[], integer, interval, boolean)', 'EXECUTE')",
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

/// `workpump --json <args>` on `url`: its exit code and parsed stdout.
fn json_of(url: &str, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json", "--database-url", url];
    all.extend_from_slice(args);
    let out = workpump(&all);
    serde_json::from_str(&expect_code(&out, code)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

async fn state_of(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT state::text FROM workpump.work_all WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read the item")
}

#[tokio::test]
async fn queues_items_and_instances_show_a_store_with_work_in_every_state() {
    let fresh = workpump_coordinator::testing::fresh_store().await;
    let items = workpump_coordinator::testing::every_state(&fresh.coordinator).await;
    let url = fresh.db.url();

    let queues = json_of(url, &["queues"], 0);
    let emails = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue"] == "emails")
        .expect("emails");
    assert_eq!(
        (
            &emails["available"],
            &emails["scheduled"],
            &emails["running"],
            &emails["blocked"]
        ),
        (
            &Value::from(2),
            &Value::from(2),
            &Value::from(1),
            &Value::from(1)
        )
    );
    let blocked = json_of(url, &["items", "list", "--state", "blocked"], 0);
    assert_eq!(blocked["items"][0]["id"], items.blocked);
    assert_eq!(blocked["items"][0]["state"], "blocked");
    assert_eq!(blocked["items"].as_array().expect("items").len(), 1);
    let of_key = json_of(url, &["items", "list", "--ordering-key", "customer-b"], 0);
    let key_ids: Vec<i64> = of_key["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(
        key_ids,
        vec![items.blocked, items.available[1]],
        "newest first"
    );
    assert_eq!(emails["dead"]["items"], 2);
    let table = expect_code(&workpump(&["queues", "--database-url", url]), 0);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("queue ") && header.contains(" owner "),
        "{table}"
    );
    let emails_line = table
        .lines()
        .find(|l| l.starts_with("emails "))
        .unwrap_or_else(|| panic!("no emails line:\n{table}"));
    let cells: Vec<&str> = emails_line.split_whitespace().collect();
    assert_eq!(
        cells[cells.len() - 2..],
        ["1", "-"],
        "every cell has its column, the last two the cancelled count (1) and the rate (none):\n{table}"
    );

    let dead = json_of(url, &["items", "list", "--state", "dead"], 0);
    let ids: Vec<i64> = dead["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();
    let mut expected = items.dead.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(ids, expected, "newest first");
    let first = json_of(
        url,
        &[
            "items", "list", "--queue", "emails", "--state", "dead", "--limit", "1",
        ],
        0,
    );
    assert_eq!(first["items"].as_array().expect("items").len(), 1);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = json_of(
        url,
        &[
            "items", "list", "--queue", "emails", "--state", "dead", "--limit", "1", "--cursor",
            &cursor,
        ],
        0,
    );
    assert_eq!(second["items"][0]["id"], items.dead[0]);
    let by_error = json_of(url, &["items", "list", "--error", "MAILBOX"], 0);
    assert_eq!(by_error["items"][0]["id"], items.dead[1]);
    assert_eq!(by_error["items"].as_array().expect("items").len(), 1);

    // By kind: each item's kind in the list, and the filter (repeatable).
    let newsletters = json_of(url, &["items", "list", "--kind", "newsletter"], 0);
    let ids_of = |v: &Value| -> Vec<i64> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["id"].as_i64().expect("id"))
            .collect()
    };
    assert_eq!(ids_of(&newsletters), vec![items.dead[1]]);
    assert_eq!(newsletters["items"][0]["kind"], "newsletter");
    let typed_dead = json_of(
        url,
        &[
            "items",
            "list",
            "--state",
            "dead",
            "--kind",
            "newsletter",
            "--kind",
            "send_email",
        ],
        0,
    );
    assert_eq!(
        ids_of(&typed_dead),
        vec![items.dead[1], items.dead[0]],
        "the untyped dead letter of reports is left out"
    );
    let all = json_of(url, &["items", "list"], 0);
    let report = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["id"] == items.dead[2])
        .expect("the report");
    assert_eq!(report["kind"], Value::Null, "an untyped item has no kind");
    let table = expect_code(
        &workpump(&["items", "list", "--state", "dead", "--database-url", url]),
        0,
    );
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("id") && lines[0].contains(" kind "),
        "{table}"
    );
    let newsletter_line = lines
        .iter()
        .find(|l| l.starts_with(&items.dead[1].to_string()))
        .unwrap_or_else(|| panic!("no line for the newsletter:\n{table}"));
    assert!(newsletter_line.contains(" newsletter "), "{table}");
    let empty_kind = workpump(&["items", "list", "--kind", "", "--database-url", url]);
    expect_code(&empty_kind, 2);
    assert!(
        text(&empty_kind.stderr).contains("'kinds'"),
        "{}",
        text(&empty_kind.stderr)
    );

    let shown = expect_code(
        &workpump(&[
            "items",
            "show",
            &items.running.to_string(),
            "--database-url",
            url,
        ]),
        0,
    );
    for text in [
        "user4@example.com",
        "checkpoint:",
        "\"sent\": 2",
        "claim token",
        "send_email",
        "metadata:",
        workpump_coordinator::testing::EVERY_STATE_TRACEPARENT,
    ] {
        assert!(shown.contains(text), "items show lacks {text:?}:\n{shown}");
    }
    let history = json_of(url, &["items", "show", &items.scheduled[0].to_string()], 0);
    assert_eq!(
        history["item"]["history"][0]["error"],
        "smtp: try again later"
    );

    let instances = json_of(url, &["instances"], 0);
    assert_eq!(
        instances["instances"][0]["instance"],
        items.instance.0.to_string()
    );
    assert_eq!(instances["instances"][0]["leases"], 1);
}

#[tokio::test]
async fn retry_cancel_discard_pause_and_resume_change_what_they_say_and_refuse_the_rest() {
    let fresh = workpump_coordinator::testing::fresh_store().await;
    let items = workpump_coordinator::testing::every_state(&fresh.coordinator).await;
    let (url, pool) = (fresh.db.url(), &fresh.pool);

    // By kind: the newsletter's dead letter, not send_email's; then cancel the newsletter.
    let report = json_of(url, &["retry", "--kind", "newsletter"], 0);
    assert_eq!(report["applied"], 1);
    assert_eq!(
        state_of(pool, items.dead[1]).await.as_deref(),
        Some("available")
    );
    assert_eq!(state_of(pool, items.dead[0]).await.as_deref(), Some("dead"));
    let cancelled = json_of(url, &["cancel", "--kind", "newsletter"], 0);
    assert_eq!(cancelled["applied"], 1, "{cancelled}");
    assert_eq!(
        state_of(pool, items.dead[1]).await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        state_of(pool, items.available[0]).await.as_deref(),
        Some("available"),
        "a send_email item is left alone"
    );

    // By ids: the dead letter is retried, the completed item refused (exit 1), unchanged.
    let out = workpump(&[
        "retry",
        &items.dead[0].to_string(),
        &items.completed.to_string(),
        "--database-url",
        url,
    ]);
    let table = expect_code(&out, 1);
    assert!(
        table.contains("retried") && table.contains("refused"),
        "{table}"
    );
    assert!(
        text(&out.stderr).contains("1 of 2 item(s) were refused"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        state_of(pool, items.dead[0]).await.as_deref(),
        Some("available")
    );
    assert_eq!(
        state_of(pool, items.completed).await.as_deref(),
        Some("completed")
    );

    // By filter: every dead letter of reports.
    let report = json_of(url, &["retry", "--queue", "reports"], 0);
    assert_eq!(report["applied"], 1);
    assert_eq!(
        state_of(pool, items.dead[2]).await.as_deref(),
        Some("available")
    );
    // Without ids or a filter: refused unless --all.
    let bare = workpump(&["discard", "--database-url", url]);
    expect_code(&bare, 2);
    assert!(
        text(&bare.stderr).contains("--all"),
        "{}",
        text(&bare.stderr)
    );
    assert_eq!(
        state_of(pool, items.completed).await.as_deref(),
        Some("completed")
    );
    let both = workpump(&["discard", "1", "--queue", "emails", "--database-url", url]);
    expect_code(&both, 2);
    let everything = json_of(url, &["discard", "--all"], 0);
    assert!(
        everything["applied"].as_u64().expect("applied") >= 3,
        "{everything}"
    );
    assert_eq!(state_of(pool, items.completed).await, None);
    assert_eq!(state_of(pool, items.cancelled).await, None);
    assert_eq!(
        state_of(pool, items.running).await.as_deref(),
        Some("running")
    );

    let cancelled = json_of(
        url,
        &[
            "cancel",
            &items.available[0].to_string(),
            &items.running.to_string(),
        ],
        0,
    );
    assert_eq!(cancelled["items"][0]["result"], "cancelled");
    assert_eq!(cancelled["items"][1]["result"], "requested");

    let missing = workpump(&["cancel", "999999999", "--database-url", url]);
    expect_code(&missing, 1);

    expect_code(&workpump(&["pause", "emails", "--database-url", url]), 0);
    let paused: bool =
        sqlx::query_scalar("SELECT paused FROM workpump.queues WHERE name = 'emails'")
            .fetch_one(pool)
            .await
            .expect("read the queue");
    assert!(paused);
    let again = expect_code(&workpump(&["pause", "emails", "--database-url", url]), 0);
    assert!(again.contains("already paused"), "{again}");
    expect_code(&workpump(&["resume", "emails", "--database-url", url]), 0);
    let unknown = workpump(&["pause", "nope", "--database-url", url]);
    expect_code(&unknown, 1);
    assert!(
        text(&unknown.stderr).contains("nope"),
        "{}",
        text(&unknown.stderr)
    );

    let set = json_of(
        url,
        &[
            "settings",
            "emails",
            "--max-attempts",
            "7",
            "--owner",
            "billing",
        ],
        0,
    );
    assert_eq!(
        (&set["max_attempts"], &set["owner"]),
        (&Value::from(7), &Value::from("billing"))
    );
    let shown = expect_code(&workpump(&["settings", "emails", "--database-url", url]), 0);
    assert!(shown.contains("max_attempts 7, owner billing"), "{shown}");
    let freed = json_of(url, &["settings", "emails", "--no-owner"], 0);
    assert_eq!(freed["owner"], Value::Null);
    assert_eq!(freed["ordering_dead_head"], "hold");
    let skip = json_of(
        url,
        &["settings", "emails", "--ordering-dead-head", "skip"],
        0,
    );
    assert_eq!(skip["ordering_dead_head"], "skip");
    let bad = workpump(&[
        "settings",
        "emails",
        "--ordering-dead-head",
        "drop",
        "--database-url",
        url,
    ]);
    expect_code(&bad, 2);
    assert!(
        text(&bad.stderr).contains("hold or skip"),
        "{}",
        text(&bad.stderr)
    );
    let refused = workpump(&[
        "settings",
        "emails",
        "--max-attempts",
        "0",
        "--database-url",
        url,
    ]);
    expect_code(&refused, 2);
    let unknown = workpump(&[
        "settings",
        "nope",
        "--max-attempts",
        "3",
        "--database-url",
        url,
    ]);
    expect_code(&unknown, 1);

    // The flow limits (docs/flow-control.md): set, shown in the listing, removed.
    let limited = json_of(
        url,
        &[
            "settings",
            "emails",
            "--max-running",
            "5",
            "--rate-limit",
            "100",
            "--rate-period-ms",
            "1000",
        ],
        0,
    );
    assert_eq!(limited["max_running"], 5);
    assert_eq!(
        (
            &limited["rate_limit"]["limit"],
            &limited["rate_limit"]["period_ms"]
        ),
        (&Value::from(100), &Value::from(1000.0))
    );
    let listing = expect_code(&workpump(&["queues", "--database-url", url]), 0);
    let emails_line = listing
        .lines()
        .find(|l| l.starts_with("emails"))
        .unwrap_or_default();
    assert!(
        emails_line.contains("/5") && emails_line.contains("100/1.0s"),
        "running against the limit, and the rate: {listing}"
    );
    let half = workpump(&[
        "settings",
        "emails",
        "--rate-limit",
        "100",
        "--database-url",
        url,
    ]);
    expect_code(&half, 2);
    let zero = workpump(&[
        "settings",
        "emails",
        "--max-running",
        "0",
        "--database-url",
        url,
    ]);
    expect_code(&zero, 2);
    let unlimited = json_of(
        url,
        &["settings", "emails", "--no-max-running", "--no-rate-limit"],
        0,
    );
    assert_eq!(
        (&unlimited["max_running"], &unlimited["rate_limit"]),
        (&Value::Null, &Value::Null)
    );

    let bad_cursor = workpump(&[
        "items",
        "list",
        "--cursor",
        "garbage",
        "--database-url",
        url,
    ]);
    expect_code(&bad_cursor, 2);
    assert!(
        text(&bad_cursor.stderr).contains("cursor"),
        "{}",
        text(&bad_cursor.stderr)
    );
    let bad_state = workpump(&[
        "items",
        "list",
        "--state",
        "finished",
        "--database-url",
        url,
    ]);
    expect_code(&bad_state, 2);
}

#[tokio::test]
async fn run_now_makes_the_scheduled_items_due_and_refuses_a_running_one() {
    let fresh = workpump_coordinator::testing::fresh_store().await;
    let items = workpump_coordinator::testing::every_state(&fresh.coordinator).await;
    let (url, pool) = (fresh.db.url(), &fresh.pool);

    let refused = workpump(&["run-now", &items.running.to_string(), "--database-url", url]);
    let table = expect_code(&refused, 1);
    assert!(table.contains("only a scheduled item"), "{table}");
    assert_eq!(
        state_of(pool, items.running).await.as_deref(),
        Some("running")
    );

    let report = json_of(url, &["run-now", "--queue", "emails"], 0);
    assert_eq!(report["applied"], items.scheduled.len(), "{report}");
    for id in &items.scheduled {
        assert_eq!(state_of(pool, *id).await.as_deref(), Some("available"));
    }
    assert_eq!(
        state_of(pool, items.available[0]).await.as_deref(),
        Some("available")
    );
}

#[tokio::test]
async fn a_command_on_a_database_that_was_never_migrated_says_to_migrate_with_exit_code_4() {
    let (db, pool) = fresh_database().await;
    let out = workpump(&["queues", "--database-url", db.url()]);
    expect_code(&out, 4);
    assert!(
        text(&out.stderr).contains("workpump migrate"),
        "{}",
        text(&out.stderr)
    );
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn serve_prints_its_address_serves_the_dashboard_and_stops_on_sigterm() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    let fresh = workpump_coordinator::testing::fresh_store().await;
    workpump_coordinator::testing::every_state(&fresh.coordinator).await;
    let short = workpump(&[
        "serve",
        "--token",
        "short",
        "--database-url",
        fresh.db.url(),
    ]);
    expect_code(&short, 2);
    assert!(
        text(&short.stderr).contains("at least 16"),
        "{}",
        text(&short.stderr)
    );

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_workpump"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            fresh.db.url(),
        ])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start workpump serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("an address within 20 s")
        .expect("read stdout")
        .expect("a line");
    assert!(line.contains("read-only"), "{line}");
    let address = line
        .strip_prefix("dashboard: http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();

    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    stream
        .write_all(
            format!("GET / HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send");
    let mut page = String::new();
    stream.read_to_string(&mut page).await.expect("read");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("data-queue=\"emails\""), "{page}");

    let pid = child.id().expect("a pid").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .expect("it stops within 20 s of SIGTERM")
        .expect("its status");
    assert!(status.success(), "{status:?}");
}

/// A selective filter whose match lies past one call's scan budget: `items list` goes on
/// calling until it finds it (the API alone returns an empty page and a cursor).
#[tokio::test]
async fn items_list_keeps_scanning_until_its_page_is_full() {
    let fresh = workpump_coordinator::testing::fresh_store().await;
    let items = workpump_coordinator::testing::every_state(&fresh.coordinator).await;
    // 25 000 newer completed items in front of the old dead letters (shaped behind the
    // functions' backs: this only fills the table).
    sqlx::query(
        "INSERT INTO workpump.work_history (id, queue, priority, attempt, max_attempts, run_at,
                                            claim_token, renewals, cancel_requested, payload,
                                            errors, created_at, finished_at)
         SELECT nextval('workpump.work_id_seq'), 'emails', 0, 1, 3, now(),
                nextval('workpump.claim_token_seq'), 0, false, '{}', '[]', now(), now()
         FROM generate_series(1, 25000)",
    )
    .execute(&fresh.pool)
    .await
    .expect("fill");
    let one_call = fresh
        .coordinator
        .list_work(workpump_coordinator::ListWorkParams {
            filter: workpump_coordinator::WorkFilter::new().error_contains("MAILBOX"),
            cursor: None,
            page_size: Some(10),
        })
        .await
        .expect("list");
    assert!(
        one_call.items.is_empty() && one_call.scan_exhausted,
        "the match must lie past one call's budget for this test to mean anything"
    );
    let found = json_of(
        fresh.db.url(),
        &["items", "list", "--error", "MAILBOX", "--limit", "10"],
        0,
    );
    let ids: Vec<i64> = found["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids, vec![items.dead[1]]);
    assert_eq!(
        found["next_cursor"],
        Value::Null,
        "scanned to the oldest item"
    );
}

/// `held-keys` lists the key a dead head holds, with the items waiting behind it, in text and
/// JSON; retrying the dead letter releases it.
#[tokio::test]
async fn held_keys_lists_a_key_held_by_its_dead_head_until_it_is_retried() {
    let fresh = workpump_coordinator::testing::fresh_store().await;
    let url = fresh.db.url();
    let (dead, _) =
        workpump_coordinator::testing::held_key(&fresh.coordinator, "orders", "customer-7", 2)
            .await;

    let listed = expect_code(&workpump(&["held-keys", "--database-url", url]), 0);
    let row = listed
        .lines()
        .find(|l| l.starts_with("orders"))
        .unwrap_or_else(|| panic!("no row for the held key:\n{listed}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["orders", "customer-7", &dead.to_string(), "2"],
        "{listed}"
    );
    assert!(listed.contains("workpump retry"), "{listed}");

    let json = json_of(url, &["held-keys", "--queue", "orders"], 0);
    assert_eq!(json["keys"][0]["ordering_key"], "customer-7", "{json}");
    assert_eq!(json["keys"][0]["dead_id"], dead, "{json}");
    assert_eq!(json["keys"][0]["blocked"], 2, "{json}");

    expect_code(
        &workpump(&["retry", &dead.to_string(), "--database-url", url]),
        0,
    );
    let after = expect_code(&workpump(&["held-keys", "--database-url", url]), 0);
    assert!(after.contains("No ordering key is held"), "{after}");
}
