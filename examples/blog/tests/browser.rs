//! The blog in a real browser: headless Chromium driven over WebDriver (chromedriver).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them); elsewhere set
//! `CHROMEDRIVER` and `CHROMIUM` to their paths. Without them the test says so and passes,
//! except with `CI=true`, where it fails. The admin pages' screenshots are saved in
//! `target/browser/` (`outbox-overview.png`, `outbox-dead.png`, `outbox-message.png`,
//! `outbox-confirm.png`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{free_port, Server, ADMIN_TOKEN};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session on a chromedriver process of its own.
struct Browser {
    http: reqwest::blocking::Client,
    session: String,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    fn start() -> Option<Browser> {
        let driver_path =
            std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        if !Path::new(&driver_path).exists() || !Path::new(&chromium).exists() {
            let message = format!(
                "no browser: {driver_path} or {chromium} is missing; install Debian's chromium and \
                 chromium-driver (as .ci/run does) or set CHROMEDRIVER and CHROMIUM"
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{message}; CI=true, so this fails instead of skipping");
            }
            eprintln!("\n!!! SKIPPED: {message}\n");
            return None;
        }
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        assert!(
            outbox_testkit::eventually(Duration::from_secs(20), || http
                .get(format!("{base}/status"))
                .send()
                .is_ok()),
            "chromedriver did not start"
        );
        let profile = std::env::temp_dir().join(format!("outbox-chromium-{port}"));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,1100",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .body(capabilities.to_string())
            .send()
            .and_then(|r| r.bytes())
            .map(|body| serde_json::from_slice(&body).expect("WebDriver answers JSON"))
            .expect("creating a browser session");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        Some(Browser {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            profile,
        })
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if !body.is_null() {
            request = request.body(body.to_string());
        }
        let response: Value = request
            .send()
            .and_then(|r| r.bytes())
            .map(|body| serde_json::from_slice(&body).expect("WebDriver answers JSON"))
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"));
        if let Some(error) = response["value"].get("error") {
            panic!("WebDriver {path}: {error} {}", response["value"]["message"]);
        }
        response["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({ "url": url }));
    }

    fn find(&self, css: &str) -> String {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Value = self
                .http
                .post(format!("{}/element", self.session))
                .body(json!({"using": "css selector", "value": css}).to_string())
                .send()
                .and_then(|r| r.bytes())
                .map(|body| serde_json::from_slice(&body).expect("WebDriver answers JSON"))
                .expect("WebDriver /element");
            if let Some(id) = found["value"][ELEMENT].as_str() {
                return id.to_owned();
            }
            assert!(
                Instant::now() < until,
                "no element {css} on the page:\n{}",
                self.source()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Opens `url` and clicks the first `css` there.
    fn click_at(&self, url: &str, css: &str) {
        self.goto(url);
        self.click(css);
    }

    fn click(&self, css: &str) {
        let element = self.find(css);
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            json!({}),
        );
    }

    fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        );
    }

    fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", json!(null))
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits, without reloading, until the current page satisfies `done` (a click's navigation
    /// completes after the click command returns).
    fn settle(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let mut page = String::new();
        let held = outbox_testkit::eventually(Duration::from_secs(10), || {
            page = self.source();
            done(&page)
        });
        assert!(held, "timed out waiting for {what}:\n{page}");
        page
    }

    /// Reloads `url` until its page satisfies `done`.
    fn wait_for(&self, url: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
        let mut page = String::new();
        let held = outbox_testkit::eventually(Duration::from_secs(30), || {
            self.goto(url);
            page = self.source();
            done(&page)
        });
        assert!(held, "timed out waiting for {what} at {url}:\n{page}");
        page
    }

    fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let png = self.call(reqwest::Method::GET, "/screenshot", json!(null));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 PNG"))
            .expect("a base64 screenshot");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).expect("writing the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(&self.session).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn comment(browser: &Browser, server: &Server, name: &str, text: &str) -> String {
    browser.goto(&server.url("/posts/1"));
    browser.type_into("#name", name);
    browser.type_into("#email", &format!("{}@example.com", name.to_lowercase()));
    browser.type_into("#body", text);
    browser.click("#submit");
    browser.settle("the comment's notice", |page| {
        page.contains("id=\"notice\"")
    })
}

#[test]
fn a_reader_comments_an_operator_requeues_a_dead_letter() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let server = Server::start("browser");
    let receiver = server.url("/receiver");
    let outbox = server.url("/outbox");

    // The receiver's log and switch are for operators, like the admin page.
    browser.goto(&receiver);
    browser.type_into("#token", ADMIN_TOKEN);
    browser.click("#login");
    browser.settle("the receiver's log", |page| {
        page.contains("id=\"deliveries\"")
    });

    let page = comment(&browser, &server, "Grace", "What a post!");
    assert!(page.contains("Thanks for your first comment"), "{page}");
    browser.wait_for(&receiver, "Grace's thank-you", |page| {
        page.contains("grace@example.com") && page.contains("verified, delivered")
    });

    browser.goto(&receiver);
    browser.click("#toggle-failing");
    browser.settle("the failing receiver", |page| {
        page.contains("failing: every delivery is answered 500")
    });
    comment(&browser, &server, "Linus", "Me too.");

    let overview = browser.wait_for(&outbox, "two dead letters", |page| {
        page.contains("id=\"dead-count\">2<")
    });
    assert!(overview.contains("comment.thankYou") && overview.contains("comment.notification"));
    assert!(overview.contains("class=\"spark\""), "the charts");
    assert!(
        overview.contains("class=\"destination\"")
            && overview.contains("deliveries?destination=mail\">mail</a></td><td>webhook</td>")
    );
    shoot(&browser, "outbox-overview");

    let dead = browser.wait_for(&server.url("/outbox/dead"), "the dead letters", |page| {
        page.matches("class=\"dead-letter\"").count() == 2
    });
    assert!(dead.contains("gave up after 2 attempts"), "{dead}");
    assert!(dead.contains("500"), "the last error names the status");
    shoot(&browser, "outbox-dead");

    // One dead letter's page: its payload, its attempts, what went wrong.
    browser.click(".dead-letter a");
    let message = browser.settle("a dead letter's page", |page| {
        page.contains("id=\"message-payload\"")
    });
    assert!(message.contains("dead letter") && message.contains("gave up after 2 attempts"));
    assert!(message.contains("id=\"message-headers\""));
    // Its delivery log: both attempts, each answered 500 by the receiver.
    assert!(message.contains("Delivery log"), "{message}");
    assert_eq!(message.matches("class=\"attempt\"").count(), 2, "{message}");
    assert!(
        message.contains("<td class=\"status\">500</td>"),
        "{message}"
    );
    shoot(&browser, "outbox-message");

    browser.goto(&receiver);
    browser.click("#toggle-failing");
    browser.settle("the healthy receiver", |page| {
        page.contains("healthy: deliveries")
    });

    // One re-queued from its page, the other in bulk behind a confirmation with its count.
    browser.click_at(&server.url("/outbox/dead"), "button.requeue");
    browser.settle("the first re-queue", |page| {
        page.contains("Re-queued dead letter #")
    });
    browser.click("#bulk tr:last-child a.bulk-requeue");
    let confirm = browser.settle("the confirmation", |page| {
        page.contains("id=\"confirm-count\"")
    });
    assert!(
        confirm.contains("Re-queue <b>1</b> dead letter of every type"),
        "{confirm}"
    );
    shoot(&browser, "outbox-confirm");
    browser.click("#confirm");
    browser.settle("the bulk re-queue", |page| {
        page.contains("Re-queued 1 dead letter.")
    });
    browser.wait_for(&receiver, "Linus's thank-you after the re-queue", |page| {
        page.contains("linus@example.com") && page.matches("verified, delivered").count() >= 3
    });
    // The receiver links each delivery to its attempts in the outbox's delivery log.
    // The newest delivery is one of the two re-queued messages.
    browser.click("tr.delivery a.attempts");
    let attempts = browser.settle("a delivery's attempts", |page| {
        page.contains("Delivery log") && page.contains("class=\"attempt\"")
    });
    assert!(
        attempts.contains("<td class=\"status\">200</td>"),
        "{attempts}"
    );
    assert!(
        attempts.contains("<td class=\"status\">500</td>"),
        "{attempts}"
    );
    shoot(&browser, "outbox-delivery-log");
    let overview = browser.wait_for(&outbox, "no dead letters", |page| {
        page.contains("id=\"dead-count\">0<")
    });
    assert!(overview.contains("No key is blocked."));

    // An operator pauses the mail destination: a comment's messages wait, spending nothing.
    browser.click_at(&outbox, "#destinations button.pause-destination");
    browser.settle("the destination's pause", |page| {
        page.contains("Paused destination mail") && page.contains("id=\"paused\"")
    });
    // The worker reads pauses every 5 s.
    std::thread::sleep(Duration::from_secs(6));
    comment(&browser, &server, "Ada", "Is anyone there?");
    let waiting = browser.wait_for(
        &server.url("/outbox/messages"),
        "Ada's messages paused",
        |page| page.matches("is paused by an operator").count() >= 3,
    );
    assert!(waiting.contains("comment.thankYou") && waiting.contains("comment.notification"));
    assert_eq!(waiting.matches("when resumed").count(), 3, "{waiting}");
    shoot(&browser, "outbox-paused");
    // The first type of the overview's table is comment.notification: paused as well.
    browser.click_at(&outbox, "#types button.pause-type");
    browser.settle("the type's pause", |page| {
        page.contains("Paused message type comment.notification")
    });
    browser.click("#paused button.resume-destination");
    browser.settle("the destination's resume", |page| {
        page.contains("Resumed destination mail")
    });
    browser.wait_for(&receiver, "Ada's thank-you after the resume", |page| {
        page.contains("ada@example.com")
    });
    let still = browser.wait_for(&outbox, "the notifications still paused", |page| {
        page.contains("id=\"pending-count\">2<")
    });
    assert!(still.contains("class=\"quiet resume-type\""), "{still}");
    browser.click("#paused button.resume-type");
    browser.settle("the type's resume", |page| {
        page.contains("Resumed message type comment.notification")
    });
    let overview = browser.wait_for(&outbox, "everything delivered", |page| {
        page.contains("id=\"pending-count\">0<")
    });
    assert!(
        !overview.contains("id=\"paused\""),
        "nothing paused any more"
    );

    // The mail receiver lost its last hour: an operator replays it from the Deliveries page.
    // Every thank-you goes again with its id, and the receiver's inbox skips each as a
    // duplicate.
    let deliveries = browser.wait_for(
        &server.url("/outbox/deliveries?destination=mail"),
        "the mail destination's deliveries",
        |page| page.contains("id=\"replay\""),
    );
    assert!(deliveries.contains("class=\"attempt\""), "{deliveries}");
    browser.type_into("#replay-type", "comment.thankYou");
    browser.click("#replay-button");
    let replayed = browser.settle("the replay", |page| {
        page.contains("Enqueued 3 deliveries to destination mail")
    });
    shoot(&browser, "outbox-replay");
    assert!(replayed.contains("id=\"notice\""), "{replayed}");
    browser.wait_for(
        &receiver,
        "the replayed thank-yous skipped as duplicates",
        |page| page.matches("verified, duplicate: skipped").count() >= 3,
    );

    // The pending list's filters survive the round trip.
    browser.goto(&server.url("/outbox/messages"));
    browser.type_into("#filter-type", "comment.thankYou");
    browser.click("#filter");
    let filtered = browser.settle("the filtered list", |page| {
        page.contains("value=\"comment.thankYou\"")
    });
    assert!(filtered.contains("No message matches.") || filtered.contains("pending-message"));

    // Signing out ends the session: the pages ask for the token again.
    browser.click("#sign-out");
    // The click returns before its POST completes: navigating away at once could cancel it.
    browser.settle("the sign-in form after signing out", |page| {
        page.contains("id=\"token\"")
    });
    browser.goto(&outbox);
    browser.settle("the sign-in form", |page| page.contains("id=\"token\""));
}

/// Saves a screenshot as `target/browser/{name}.png` and checks it is a real image.
fn shoot(browser: &Browser, name: &str) {
    let shot =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/browser/{name}.png"));
    browser.screenshot(&shot);
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false),
        "{} is no screenshot",
        shot.display()
    );
    eprintln!("screenshot: {}", shot.display());
}
