//! The blog's routes (Rocket's local client) and its whole loop (a real server, its worker and
//! its receiver).

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use outbox_diesel::webhook::WebhookSecret;
use rocket::http::{ContentType, Header, Status};
use rocket::local::blocking::Client;
use support::{delivered, form, free_port, settings, Server, TempDb, ADMIN_TOKEN, SECRET};

fn local_client(db: &TempDb) -> Client {
    Client::tracked(outbox_example_blog::rocket(settings(db, free_port())).unwrap())
        .expect("a local client")
}

#[test]
fn the_post_page_shows_the_comment_form() {
    let db = TempDb::new("page");
    let client = local_client(&db);
    let page = client.get("/posts/1").dispatch();
    assert_eq!(page.status(), Status::Ok);
    let html = page.into_string().unwrap();
    assert!(html.contains("Why every web app needs an outbox"));
    assert!(html.contains("action=\"/posts/1/comments\""));
    assert_eq!(
        client.get("/posts/99").dispatch().status(),
        Status::NotFound
    );
}

#[test]
fn a_comment_is_saved_and_reported_and_bad_input_is_refused() {
    let db = TempDb::new("comment");
    let client = local_client(&db);
    let posted = client
        .post("/posts/1/comments")
        .header(ContentType::Form)
        .body("name=Ada&email=ada%40example.com&body=%3Cb%3EFirst%3C%2Fb%3E")
        .dispatch();
    assert_eq!(posted.status(), Status::SeeOther);
    let location = posted.headers().get_one("location").unwrap().to_owned();
    assert!(location.contains("first%20comment"), "{location}");
    let html = client.get(location).dispatch().into_string().unwrap();
    assert!(
        html.contains("&lt;b&gt;First&lt;/b&gt;"),
        "the comment is shown, escaped"
    );
    assert!(html.contains("thank-you mail is on its way"));

    let incomplete = client
        .post("/posts/1/comments")
        .header(ContentType::Form)
        .body("name=&email=nobody&body=x")
        .dispatch();
    let location = incomplete.headers().get_one("location").unwrap().to_owned();
    assert!(location.contains("error="), "{location}");
}

#[test]
fn cross_site_posts_are_refused() {
    let db = TempDb::new("csrf");
    let client = local_client(&db);
    let forged = client
        .post("/posts/1/comments")
        .header(ContentType::Form)
        .header(Header::new("Sec-Fetch-Site", "cross-site"))
        .body("name=Eve&email=eve%40example.com&body=spam")
        .dispatch();
    assert_eq!(forged.status(), Status::Forbidden);
    let forged = client
        .post("/receiver/mode")
        .header(ContentType::Form)
        .header(Header::new("Origin", "http://evil.example"))
        .header(Header::new("Host", "127.0.0.1:8000"))
        .body("failing=on")
        .dispatch();
    assert_eq!(forged.status(), Status::Forbidden);
}

#[test]
fn the_admin_page_needs_the_token() {
    let db = TempDb::new("admin");
    let client = local_client(&db);
    let anonymous = client.get("/outbox").dispatch().into_string().unwrap();
    assert!(anonymous.contains("admin token"), "a login form");
    assert!(!anonymous.contains("dead-count"));
    assert_eq!(
        client.post("/outbox/dead/1/purge").dispatch().status(),
        Status::Unauthorized
    );

    let wrong = client
        .post("/outbox/login")
        .header(ContentType::Form)
        .body("token=guess")
        .dispatch()
        .into_string()
        .unwrap();
    assert!(wrong.contains("not the admin token"));

    let signed_in = client
        .post("/outbox/login")
        .header(ContentType::Form)
        .body(format!("token={ADMIN_TOKEN}"))
        .dispatch();
    assert_eq!(signed_in.status(), Status::SeeOther);
    let page = client.get("/outbox").dispatch().into_string().unwrap();
    assert!(page.contains("id=\"dead-count\">0<"), "{page}");
    assert!(!page.contains(SECRET), "no secret on the page");
}

fn post_comment(client: &reqwest::blocking::Client, server: &Server, name: &str, body: &str) {
    let response = client
        .post(server.url("/posts/1/comments"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("name", name),
            ("email", &format!("{}@example.com", name.to_lowercase())),
            ("body", body),
        ]))
        .send()
        .unwrap();
    assert!(response.status().is_success() || response.status().is_redirection());
}

#[test]
fn comments_turn_into_verified_deliveries_once() {
    let server = Server::start("loop");
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    post_comment(&client, &server, "Ada", "First!");
    server.wait_for("Ada's thank-you", |d| {
        delivered(d, "comment.thankYou", "ada@example.com") == 1
    });

    post_comment(&client, &server, "Bob", "Second.");
    server.wait_for("Bob's thank-you and Ada's notification", |d| {
        delivered(d, "comment.thankYou", "bob@example.com") == 1
            && delivered(d, "comment.notification", "ada@example.com") == 1
    });

    post_comment(&client, &server, "Ada", "Me again.");
    let deliveries = server.wait_for("Bob's notification", |d| {
        delivered(d, "comment.notification", "bob@example.com") == 1
    });
    assert_eq!(deliveries.len(), 4, "{deliveries:#?}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let deliveries = server.deliveries();
    assert_eq!(
        delivered(&deliveries, "comment.thankYou", "ada@example.com"),
        1,
        "no second thank-you: {deliveries:#?}"
    );
    assert_eq!(deliveries.len(), 4, "{deliveries:#?}");

    // A sender retrying after a lost answer: the same signed request twice.
    let body = br#"{"id":"dup-1","type":"comment.thankYou","data":{"email":"zoe@example.com"}}"#;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let signature = WebhookSecret::parse(SECRET)
        .unwrap()
        .sign("dup-1", now, body);
    for _ in 0..2 {
        let response = client
            .post(server.url("/receiver/hooks"))
            .header("webhook-id", "dup-1")
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", &signature)
            .body(body.to_vec())
            .send()
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let forged = client
        .post(server.url("/receiver/hooks"))
        .header("webhook-id", "dup-2")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", "v1,AAAA")
        .body(body.to_vec())
        .send()
        .unwrap();
    assert_eq!(forged.status(), 401);

    let log = server.deliveries();
    let dup: Vec<_> = log.iter().filter(|d| d.webhook_id == "dup-1").collect();
    assert_eq!(dup.len(), 2);
    assert_eq!(dup[0].outcome, "verified, delivered");
    assert_eq!(dup[1].outcome, "verified, duplicate: skipped");
    assert_eq!(
        delivered(&log, "comment.thankYou", "zoe@example.com"),
        1,
        "recorded once"
    );
    assert!(log
        .iter()
        .any(|d| d.webhook_id == "dup-2" && d.outcome.starts_with("rejected")));
}

#[test]
fn metrics_show_the_backlog_from_the_start_and_the_deliveries() {
    let server = Server::start("metrics");
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let scrape = || {
        let response = client.get(server.url("/metrics")).send().unwrap();
        assert_eq!(response.status(), 200);
        response.text().unwrap()
    };
    // The worker samples the backlog as it starts.
    assert!(
        outbox_testkit::eventually(std::time::Duration::from_secs(10), || scrape()
            .contains("outbox_pending_messages ")),
        "{}",
        scrape()
    );
    assert!(scrape().contains("outbox_oldest_due_age_seconds "));

    post_comment(&client, &server, "Cy", "Hello.");
    server.wait_for("Cy's thank-you", |d| {
        delivered(d, "comment.thankYou", "cy@example.com") == 1
    });
    let succeeded =
        "outbox_messages_processed_total{type=\"comment.thankYou\",outcome=\"succeeded\"}";
    assert!(
        outbox_testkit::eventually(std::time::Duration::from_secs(10), || scrape()
            .lines()
            .any(|line| line.starts_with(succeeded))),
        "{}",
        scrape()
    );
    let text = scrape();
    assert!(
        text.contains("outbox_attempt_duration_seconds_bucket{type=\"comment.thankYou\""),
        "histograms with buckets: {text}"
    );
    assert!(
        !text.contains("cy@example.com"),
        "no personal data in the metrics"
    );
}
