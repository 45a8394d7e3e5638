//! The dashboard over HTTP, without a browser: every page on a store with work in every
//! state; who may change things (read-only, no session, a wrong CSRF token, another site) and
//! that a refused change changes nothing; bulk changes only after their confirmation.

mod support;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;
use workpump_dashboard::Access;

use support::{dashboard, paused, state_of, store, TOKEN};

/// A response's status, headers and body text.
struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("a response");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 4 << 20)
        .await
        .expect("the body");
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

async fn get(app: &Router, path: &str, cookie: Option<&str>) -> Reply {
    let mut request = Request::get(path).header(header::HOST, "127.0.0.1:8080");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    send(app, request.body(Body::empty()).expect("a request")).await
}

async fn post(
    app: &Router,
    path: &str,
    cookie: Option<&str>,
    form: &str,
    origin: Option<&str>,
) -> Reply {
    let mut request = Request::post(path)
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    if let Some(origin) = origin {
        request = request.header(header::ORIGIN, origin);
    }
    send(
        app,
        request
            .body(Body::from(form.to_owned()))
            .expect("a request"),
    )
    .await
}

/// Logs in with the token: the session cookie and the page's CSRF token.
async fn login(app: &Router) -> (String, String) {
    let reply = post(app, "/login", None, &format!("token={TOKEN}&next=/"), None).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let set = reply.headers[header::SET_COOKIE].to_str().expect("ascii");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().expect("name=value").to_owned();
    let page = get(app, "/", Some(&cookie)).await;
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a logged-in page carries the CSRF token")
        .to_owned();
    (cookie, csrf)
}

/// A host's heartbeat carries its health summary (`metadata.health`); the instances page
/// shows it with the reasons, and "not reported" for an instance without one.
#[tokio::test]
async fn the_instances_page_shows_each_instance_s_health_and_its_reasons() {
    use workpump_coordinator::{
        AliveLockReport, InstanceId, RecordHeartbeatParams, WorkCoordinator,
    };
    let (fresh, items) = store().await;
    let degraded = InstanceId::new();
    fresh
        .coordinator
        .record_heartbeat(RecordHeartbeatParams {
            instance: degraded,
            host: "degraded-host".into(),
            metadata: serde_json::json!({
                "pid": 7,
                "health": {
                    "status": "degraded",
                    "reasons": ["claim: degraded since 2026-12-02T03:22:01Z (3 failures): LISTEN unavailable"]
                }
            }),
            stale_after: std::time::Duration::from_secs(30),
            dead_after: Some(std::time::Duration::from_secs(300)),
            lock_grace: None,
            alive_lock: AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .expect("heartbeat");
    let app = dashboard(&fresh.coordinator, Access::ReadOnly);
    let page = get(&app, "/instances", None).await;
    assert_eq!(page.status, StatusCode::OK);
    let row = |id: &str| {
        let start = page.body.find(id).expect("the instance's row");
        let end = page.body[start..]
            .find("</tr>")
            .map_or(page.body.len(), |e| start + e);
        page.body[start..end].to_owned()
    };
    let degraded_row = row(&degraded.0.to_string());
    assert!(
        degraded_row.contains("class=\"badge s-running\">degraded<"),
        "{degraded_row}"
    );
    assert!(
        degraded_row.contains(
            "claim: degraded since 2026-12-02T03:22:01Z (3 failures): LISTEN unavailable"
        ),
        "{degraded_row}"
    );
    let silent_row = row(&items.instance.0.to_string());
    assert!(silent_row.contains("not reported"), "{silent_row}");
}

#[tokio::test]
async fn every_page_renders_a_store_with_work_in_every_state() {
    let (fresh, items) = store().await;
    let app = dashboard(&fresh.coordinator, Access::ReadOnly);

    let overview = get(&app, "/", None).await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    for text in ["emails", "reports", "http-equiv=\"refresh\"", "read-only"] {
        assert!(overview.body.contains(text), "the overview lacks {text:?}");
    }
    let queue = get(&app, "/queues/emails", None).await;
    assert_eq!(queue.status, StatusCode::OK);
    assert!(queue.body.contains("Queue emails"));

    let listed = get(&app, "/items", None).await;
    assert_eq!(listed.status, StatusCode::OK);
    for state in [
        "available",
        "scheduled",
        "running",
        "completed",
        "dead",
        "cancelled",
    ] {
        assert!(
            listed
                .body
                .contains(&format!("class=\"badge s-{state}\">{state}<")),
            "the item list shows no {state} item"
        );
    }
    let dead_only = get(&app, "/items?state=dead&queue=emails", None).await;
    assert_eq!(dead_only.body.matches("class=\"badge s-dead\"").count(), 2);
    let by_error = get(&app, "/items?error=MAILBOX", None).await;
    assert!(by_error
        .body
        .contains(&format!("data-id=\"{}\"", items.dead[1])));
    assert!(!by_error
        .body
        .contains(&format!("data-id=\"{}\"", items.dead[0])));

    // Each item's kind in the list, and the kind filter (kept by the form).
    assert!(listed.body.contains("<th>kind</th>"));
    assert!(listed.body.contains("<td>send_email</td>"));
    let newsletters = get(&app, "/items?kind=newsletter", None).await;
    assert_eq!(newsletters.status, StatusCode::OK);
    assert_eq!(newsletters.body.matches("<tr data-id=").count(), 1);
    assert!(newsletters
        .body
        .contains(&format!("data-id=\"{}\"", items.dead[1])));
    assert!(newsletters
        .body
        .contains("name=\"kind\" value=\"newsletter\""));
    let typed_dead = get(&app, "/items?kind=send_email&state=dead", None).await;
    assert_eq!(typed_dead.body.matches("<tr data-id=").count(), 1);
    assert!(typed_dead
        .body
        .contains(&format!("data-id=\"{}\"", items.dead[0])));
    let dead_letters = get(&app, "/dead", None).await;
    assert!(dead_letters.body.contains("<td>newsletter</td>"));

    let running = get(&app, &format!("/items/{}", items.running), None).await;
    assert_eq!(running.status, StatusCode::OK);
    for text in [
        "user4@example.com",
        "id=\"checkpoint\"",
        "sent",
        "claim token",
        "lease expires",
        "<dt>kind</dt><dd>send_email</dd>",
        "id=\"metadata\"",
        workpump_coordinator::testing::EVERY_STATE_TRACEPARENT,
    ] {
        assert!(
            running.body.contains(text),
            "the running item's page lacks {text:?}"
        );
    }
    let dead = get(&app, &format!("/items/{}", items.dead[0]), None).await;
    assert!(dead.body.contains("smtp: connection refused"));
    assert!(
        !dead.body.contains("id=\"retry\""),
        "a read-only page offers a retry"
    );
    let retrying = get(&app, &format!("/items/{}", items.scheduled[0]), None).await;
    assert!(retrying.body.contains("smtp: try again later"));
    let report = get(&app, &format!("/items/{}", items.dead[2]), None).await;
    assert!(report.body.contains("<dt>kind</dt><dd>(untyped)</dd>"));
    assert!(
        !report.body.contains("id=\"metadata\""),
        "an item without metadata shows none"
    );

    let instances = get(&app, "/instances", None).await;
    assert!(instances.body.contains(&items.instance.0.to_string()));
    assert!(instances.body.contains("test-host"));
    let dead_page = get(&app, "/dead", None).await;
    for id in &items.dead {
        assert!(dead_page.body.contains(&format!("data-id=\"{id}\"")));
    }
    for id in items
        .available
        .iter()
        .chain([&items.completed, &items.cancelled])
    {
        assert!(!dead_page.body.contains(&format!("data-id=\"{id}\"")));
    }
}

/// A queue's page lists the ordering keys its dead letters hold, each linking to its dead
/// letter with the items waiting behind it; a queue without one shows no such section.
#[tokio::test]
async fn a_queue_page_lists_the_ordering_keys_held_by_a_dead_letter() {
    let (fresh, _) = store().await;
    let (dead, waiting) =
        workpump_coordinator::testing::held_key(&fresh.coordinator, "orders", "customer-7", 2)
            .await;
    assert_eq!(waiting.len(), 2);
    let app = dashboard(&fresh.coordinator, Access::ReadOnly);

    let orders = get(&app, "/queues/orders", None).await;
    assert_eq!(orders.status, StatusCode::OK, "{}", orders.body);
    assert!(orders.body.contains("id=\"held-keys\""), "{}", orders.body);
    let row = format!(
        "<tr data-key=\"customer-7\"><td>customer-7</td><td><a href=\"/items/{dead}\">{dead}</a></td><td class=\"num\">2</td></tr>"
    );
    assert!(
        orders.body.contains(&row),
        "no row {row} in\n{}",
        orders.body
    );

    let emails = get(&app, "/queues/emails", None).await;
    assert_eq!(emails.status, StatusCode::OK);
    assert!(!emails.body.contains("held-keys"), "{}", emails.body);
}

/// A queue's page shows its fleet-wide flow limits (docs/flow-control.md), or `unlimited`.
#[tokio::test]
async fn a_queue_page_shows_its_flow_limits() {
    use workpump_coordinator::{Operations, RateLimit, SetQueueSettingsParams};
    let (fresh, _) = store().await;
    let app = dashboard(&fresh.coordinator, Access::ReadOnly);
    let before = get(&app, "/queues/emails", None).await;
    assert!(
        before
            .body
            .contains("<dd id=\"max-running\">unlimited</dd>"),
        "{}",
        before.body
    );
    assert!(before.body.contains("<dd id=\"rate-limit\">unlimited</dd>"));

    fresh
        .coordinator
        .set_queue_settings(SetQueueSettingsParams {
            max_running: Some(Some(50)),
            rate_limit: Some(Some(RateLimit::new(
                1_000,
                std::time::Duration::from_secs(1),
            ))),
            ..SetQueueSettingsParams::new("emails")
        })
        .await
        .expect("set the limits");
    let after = get(&app, "/queues/emails", None).await;
    assert!(
        after.body.contains("<dd id=\"max-running\">50</dd>"),
        "{}",
        after.body
    );
    assert!(
        after
            .body
            .contains("<dd id=\"rate-limit\">1000 per 1s</dd>"),
        "{}",
        after.body
    );
}

#[tokio::test]
async fn unknown_items_queues_states_and_cursors_are_clear_errors() {
    let (fresh, _items) = store().await;
    let app = dashboard(&fresh.coordinator, Access::ReadOnly);
    let missing = get(&app, "/items/999999999", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.body.contains("work item 999999999 not found"),
        "{}",
        missing.body
    );
    let queue = get(&app, "/queues/nope", None).await;
    assert_eq!(queue.status, StatusCode::NOT_FOUND);
    assert!(queue.body.contains("nope"));
    let state = get(&app, "/items?state=finished", None).await;
    assert_eq!(state.status, StatusCode::BAD_REQUEST);
    assert!(state.body.contains("unknown state"), "{}", state.body);
    let cursor = get(&app, "/items?cursor=garbage", None).await;
    assert_eq!(cursor.status, StatusCode::BAD_REQUEST);
    assert!(cursor.body.contains("cursor"), "{}", cursor.body);
}

#[tokio::test]
async fn a_change_is_refused_and_changes_nothing_without_a_session_a_matching_csrf_token_or_from_another_site(
) {
    let (fresh, items) = store().await;
    let pool = &fresh.pool;
    let dead = items.dead[0];
    let retry = format!("/items/{dead}/retry");

    let read_only = dashboard(&fresh.coordinator, Access::ReadOnly);
    let refused = post(&read_only, &retry, None, "csrf=x", None).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("read-only"));
    let read_only_login = post(&read_only, "/login", None, &format!("token={TOKEN}"), None).await;
    assert_eq!(read_only_login.status, StatusCode::FORBIDDEN);

    let app = dashboard(&fresh.coordinator, Access::Token(TOKEN.into()));
    let anonymous = post(&app, &retry, None, "csrf=x", None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong = post(&app, "/login", None, "token=not-the-token", None).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.headers.get(header::SET_COOKIE).is_none());

    let (cookie, csrf) = login(&app).await;
    let forged = post(&app, &retry, Some(&cookie), "csrf=0000", None).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(forged.body.contains("CSRF"));
    let cross = post(
        &app,
        &retry,
        Some(&cookie),
        &format!("csrf={csrf}"),
        Some("http://evil.example"),
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    assert!(cross.body.contains("another site"));
    let pause = post(
        &app,
        "/queues/emails/pause",
        Some(&cookie),
        "csrf=0000",
        None,
    )
    .await;
    assert_eq!(pause.status, StatusCode::FORBIDDEN);
    assert_eq!(
        state_of(pool, dead).await.as_deref(),
        Some("dead"),
        "a refused retry changed the item"
    );
    assert!(
        !paused(pool, "emails").await,
        "a refused pause paused the queue"
    );

    let done = post(
        &app,
        &retry,
        Some(&cookie),
        &format!("csrf={csrf}"),
        Some("http://127.0.0.1:8080"),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(state_of(pool, dead).await.as_deref(), Some("available"));
    let again = post(&app, &retry, Some(&cookie), &format!("csrf={csrf}"), None).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(again.body.contains("available"), "{}", again.body);

    let paused_now = post(
        &app,
        "/queues/emails/pause",
        Some(&cookie),
        &format!("csrf={csrf}"),
        None,
    )
    .await;
    assert_eq!(paused_now.status, StatusCode::SEE_OTHER);
    assert!(paused(pool, "emails").await);
    let resumed = post(
        &app,
        "/queues/emails/resume",
        Some(&cookie),
        &format!("csrf={csrf}"),
        None,
    )
    .await;
    assert_eq!(resumed.status, StatusCode::SEE_OTHER);
    assert!(!paused(pool, "emails").await);

    let logout = post(
        &app,
        "/logout",
        Some(&cookie),
        &format!("csrf={csrf}"),
        None,
    )
    .await;
    assert_eq!(logout.status, StatusCode::SEE_OTHER);
    let after = post(
        &app,
        &format!("/items/{}/discard", items.completed),
        Some(&cookie),
        &format!("csrf={csrf}"),
        None,
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        state_of(pool, items.completed).await.as_deref(),
        Some("completed")
    );
}

#[tokio::test]
async fn a_bulk_change_asks_for_confirmation_first_and_reports_what_it_refused() {
    let (fresh, items) = store().await;
    let pool = &fresh.pool;
    let app = dashboard(&fresh.coordinator, Access::Token(TOKEN.into()));
    let (cookie, csrf) = login(&app).await;

    let form = format!(
        "csrf={csrf}&action=retry&queue=emails&id={}&id={}&id={}",
        items.dead[0], items.dead[1], items.completed
    );
    let ask = post(&app, "/bulk", Some(&cookie), &form, None).await;
    assert_eq!(ask.status, StatusCode::OK);
    assert!(ask.body.contains("id=\"confirm\""), "{}", ask.body);
    assert!(
        ask.body.contains("3 checked dead letter(s)"),
        "{}",
        ask.body
    );
    for id in &items.dead[..2] {
        assert_eq!(
            state_of(pool, *id).await.as_deref(),
            Some("dead"),
            "changed before the confirmation"
        );
    }

    let done = post(
        &app,
        "/bulk",
        Some(&cookie),
        &format!("{form}&confirm=yes"),
        None,
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("2 item(s) changed"), "{}", done.body);
    assert!(
        done.body.contains(&format!(">{}<", items.completed)),
        "the refused item is listed"
    );
    for id in &items.dead[..2] {
        assert_eq!(state_of(pool, *id).await.as_deref(), Some("available"));
    }
    assert_eq!(
        state_of(pool, items.completed).await.as_deref(),
        Some("completed")
    );

    let whole = format!("csrf={csrf}&action=discard&queue=reports&scope=queue");
    let ask = post(&app, "/bulk", Some(&cookie), &whole, None).await;
    assert!(
        ask.body.contains("every dead letter of queue reports"),
        "{}",
        ask.body
    );
    assert_eq!(state_of(pool, items.dead[2]).await.as_deref(), Some("dead"));
    let done = post(
        &app,
        "/bulk",
        Some(&cookie),
        &format!("{whole}&confirm=yes"),
        None,
    )
    .await;
    assert!(done.body.contains("1 item(s) changed"), "{}", done.body);
    assert_eq!(state_of(pool, items.dead[2]).await, None, "discarded");

    let nothing = post(
        &app,
        "/bulk",
        Some(&cookie),
        &format!("csrf={csrf}&action=retry&confirm=yes"),
        None,
    )
    .await;
    assert_eq!(nothing.status, StatusCode::BAD_REQUEST);
    let no_queue = post(
        &app,
        "/bulk",
        Some(&cookie),
        &format!("csrf={csrf}&action=retry&scope=queue&confirm=yes"),
        None,
    )
    .await;
    assert_eq!(no_queue.status, StatusCode::BAD_REQUEST);
    let cancel = post(
        &app,
        "/bulk",
        Some(&cookie),
        &format!(
            "csrf={csrf}&action=cancel&id={}&confirm=yes",
            items.available[0]
        ),
        None,
    )
    .await;
    assert_eq!(cancel.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        state_of(pool, items.available[0]).await.as_deref(),
        Some("available")
    );
}

#[test]
fn a_short_token_or_a_malformed_base_path_is_refused_naming_the_setting() {
    use workpump_dashboard::{router, DashboardConfig};
    let store = workpump_coordinator::FakeCoordinator::new();
    let mut short = DashboardConfig::default();
    short.access = Access::Token("short".into());
    let e = router(std::sync::Arc::new(store.clone()), short).expect_err("refused");
    assert!(e.to_string().contains("at least 16"), "{e}");
    let mut base = DashboardConfig::default();
    base.base_path = "workpump/".into();
    let e = router(std::sync::Arc::new(store), base).expect_err("refused");
    assert!(e.to_string().contains("base_path"), "{e}");
}

#[tokio::test]
async fn nested_under_a_base_path_its_links_forms_and_cookie_carry_the_path() {
    let (fresh, items) = store().await;
    let mut config = workpump_dashboard::DashboardConfig::default();
    config.access = Access::Token(TOKEN.into());
    config.base_path = "/ops/workpump".into();
    let dashboard =
        workpump_dashboard::router(std::sync::Arc::new(fresh.coordinator.clone()), config)
            .expect("a valid configuration");
    let app = Router::new().nest("/ops/workpump", dashboard);

    let page = get(&app, "/ops/workpump", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("href=\"/ops/workpump/queues/emails\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("href=\"/ops/workpump/login\""));
    let login = post(
        &app,
        "/ops/workpump/login",
        None,
        &format!("token={TOKEN}&next=/elsewhere"),
        None,
    )
    .await;
    assert_eq!(login.status, StatusCode::SEE_OTHER);
    assert_eq!(
        login.headers[header::LOCATION],
        "/ops/workpump",
        "a next outside the dashboard is not followed"
    );
    let set = login.headers[header::SET_COOKIE].to_str().expect("ascii");
    assert!(set.contains("Path=/ops/workpump;"), "{set}");
    assert!(
        page.body.contains("class=\"brand\" href=\"/ops/workpump\""),
        "{}",
        page.body
    );
    let cookie = set.split(';').next().expect("name=value");
    let item = get(
        &app,
        &format!("/ops/workpump/items/{}", items.dead[0]),
        Some(cookie),
    )
    .await;
    assert!(
        item.body.contains(&format!(
            "action=\"/ops/workpump/items/{}/retry\"",
            items.dead[0]
        )),
        "{}",
        item.body
    );
}
