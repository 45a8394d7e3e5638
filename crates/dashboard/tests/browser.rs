//! The dashboard in a real browser: headless Chromium driven through its WebDriver
//! (`chromedriver`, Debian's `chromium` and `chromium-driver`; `.ci/run` installs them).
//! Every page loads on a store with work in every state; a dead letter is retried by
//! clicking; a paused queue stops its claims. Screenshots of each page are saved under
//! `target/dashboard-screenshots/` for review.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use workpump_coordinator::{ClaimWorkParams, WorkCoordinator};
use workpump_dashboard::Access;

use support::{dashboard, paused, state_of, store, TOKEN};

const DEADLINE: Duration = Duration::from_secs(20);

/// `chromedriver` on a free port of the loopback, killed with its browsers when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Driver {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("its address").port()
        };
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start chromedriver ({e}): install Debian's chromium and chromium-driver (.ci/run does)")
            });
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + DEADLINE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port} within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Driver { child, url }
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The browsers it started first (its children: a browser's own helper processes end
        // with it), also when the test panics before closing its session; then the driver.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("pkill")
                .args(["-KILL", "-P", &pid.to_string()])
                .status();
        }
        let _ = self.child.start_kill();
    }
}

/// Serves `app` on a free port of the loopback.
async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    address
}

fn screenshots() -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

async fn snap(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).expect("save the screenshot");
}

async fn text_of(browser: &Client, css: &str) -> String {
    match browser.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.expect("its text"),
        Err(e) => {
            let url = browser.current_url().await.expect("the page's URL");
            let page = browser
                .find(Locator::Css("main"))
                .await
                .expect("a page")
                .text()
                .await;
            panic!(
                "no {css} on {url}: {e}\nthe page reads:\n{}",
                page.unwrap_or_default()
            )
        }
    }
}

async fn click(browser: &Client, css: &str) {
    let url = browser.current_url().await.expect("the page's URL");
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} to click on {url}: {e}"))
        .click()
        .await
        .expect("click");
}

/// Clicks `css` and waits until the page it leads to shows `then` (an element the page
/// clicked on does not have), so what follows reads the new page, not the old one.
async fn click_then(browser: &Client, css: &str, then: &str) {
    assert!(
        browser.find(Locator::Css(then)).await.is_err(),
        "{then} is already on the page before clicking {css}"
    );
    click(browser, css).await;
    if let Err(e) = browser
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(then))
        .await
    {
        let page = browser
            .find(Locator::Css("main"))
            .await
            .expect("a page")
            .text()
            .await;
        panic!(
            "after clicking {css}, no {then} within {DEADLINE:?}: {e}\nthe page reads:\n{}",
            page.unwrap_or_default()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_loads_a_dead_letter_is_retried_by_clicking_and_a_paused_queue_stops_its_claims()
{
    let (fresh, items) = store().await;
    let pool = fresh.pool.clone();
    let address = serve(dashboard(&fresh.coordinator, Access::Token(TOKEN.into()))).await;
    let base = format!("http://{address}");
    let driver = Driver::start().await;
    let browser = driver.browser().await;

    // Every page, read before logging in.
    let pages = [
        ("overview", "/".to_owned(), "Queues · workpump"),
        (
            "queue",
            "/queues/emails".to_owned(),
            "Queue emails · workpump",
        ),
        ("items", "/items".to_owned(), "Items · workpump"),
        (
            "item-running",
            format!("/items/{}", items.running),
            &*format!("Item {} · workpump", items.running),
        ),
        (
            "item-dead",
            format!("/items/{}", items.dead[0]),
            &*format!("Item {} · workpump", items.dead[0]),
        ),
        ("instances", "/instances".to_owned(), "Instances · workpump"),
        ("dead", "/dead".to_owned(), "Dead letters · workpump"),
    ]
    .map(|(name, path, title)| (name, path, title.to_owned()));
    for (name, path, title) in &pages {
        browser.goto(&format!("{base}{path}")).await.expect("load");
        assert_eq!(&browser.title().await.expect("a title"), title, "{path}");
        snap(&browser, name).await;
    }
    browser.goto(&format!("{base}/")).await.expect("load");
    let emails = text_of(&browser, "tr[data-queue='emails']").await;
    assert!(emails.contains("emails"), "{emails}");
    browser
        .goto(&format!("{base}/items/{}", items.running))
        .await
        .expect("load");
    assert!(text_of(&browser, "#payload")
        .await
        .contains("user4@example.com"));
    assert!(text_of(&browser, "#checkpoint")
        .await
        .contains("\"sent\": 2"));

    // Log in with the token.
    browser.goto(&format!("{base}/login")).await.expect("load");
    browser
        .find(Locator::Css("#token"))
        .await
        .expect("the token field")
        .send_keys(TOKEN)
        .await
        .expect("type the token");
    click_then(&browser, "#login-submit", "#logout").await;

    // Retry a dead letter by clicking.
    let dead = items.dead[0];
    browser
        .goto(&format!("{base}/items/{dead}"))
        .await
        .expect("load");
    click_then(&browser, "#retry", "#notice").await;
    assert!(text_of(&browser, "#notice").await.contains("retried"));
    assert_eq!(text_of(&browser, "#state").await, "available");
    assert_eq!(state_of(&pool, dead).await.as_deref(), Some("available"));
    snap(&browser, "item-retried").await;

    // Retry a checked dead letter from the list, through the confirmation.
    let second = items.dead[1];
    browser
        .goto(&format!("{base}/dead?queue=emails"))
        .await
        .expect("load");
    snap(&browser, "dead-logged-in").await;
    click(&browser, &format!("#check-{second}")).await;
    click_then(&browser, "#retry-checked", "#confirm").await;
    assert!(text_of(&browser, "#what")
        .await
        .contains(&second.to_string()));
    assert_eq!(
        state_of(&pool, second).await.as_deref(),
        Some("dead"),
        "changed before confirming"
    );
    snap(&browser, "confirm").await;
    click_then(&browser, "#confirm", "#applied").await;
    assert!(text_of(&browser, "#applied")
        .await
        .contains("1 item(s) changed"));
    assert_eq!(state_of(&pool, second).await.as_deref(), Some("available"));

    // Pause the queue by clicking: claims hand out none of its items; resume: they do.
    browser
        .goto(&format!("{base}/queues/emails"))
        .await
        .expect("load");
    click_then(&browser, "#pause", "#resume").await;
    assert_eq!(text_of(&browser, "#paused").await, "paused");
    assert!(paused(&pool, "emails").await);
    snap(&browser, "queue-paused").await;
    let claim = || {
        fresh.coordinator.claim_work(ClaimWorkParams {
            instance: items.instance,
            queues: vec!["emails".into()],
            max_items: 100,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
    };
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.work_all WHERE queue = 'emails' AND state = 'available'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert!(waiting >= 4, "{waiting} items wait in emails");
    assert!(
        claim().await.expect("claim").items.is_empty(),
        "a paused queue handed out items"
    );
    click_then(&browser, "#resume", "#pause").await;
    assert!(!paused(&pool, "emails").await);
    assert_eq!(claim().await.expect("claim").items.len() as i64, waiting);

    browser.close().await.expect("close the browser");
    for (name, _, _) in &pages {
        let len = std::fs::metadata(screenshots().join(format!("{name}.png")))
            .expect("saved")
            .len();
        assert!(len > 1_000, "{name}.png is {len} bytes");
    }
}
