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
fn the_receiver_page_and_its_switch_are_for_operators() {
    let db = TempDb::new("receiver-login");
    let client = local_client(&db);
    let anonymous = client.get("/receiver").dispatch();
    assert_eq!(anonymous.status(), Status::SeeOther);
    assert_eq!(
        anonymous.headers().get_one("location"),
        Some("/outbox/login?next=%2Freceiver")
    );
    let login = client.get("/outbox/login?next=%2Freceiver").dispatch();
    let login = login.into_string().unwrap();
    assert!(login.contains("admin token") && login.contains("value=\"/receiver\""));
    let switch = client
        .post("/receiver/mode")
        .header(ContentType::Form)
        .body("failing=on")
        .dispatch();
    assert_eq!(switch.status(), Status::Unauthorized);

    let signed_in = client
        .post("/outbox/login")
        .header(ContentType::Form)
        .body(format!("token={ADMIN_TOKEN}&next=%2Freceiver"))
        .dispatch();
    assert_eq!(signed_in.headers().get_one("location"), Some("/receiver"));
    let page = client.get("/receiver").dispatch().into_string().unwrap();
    assert!(page.contains("id=\"deliveries\""), "{page}");
    let switched = client
        .post("/receiver/mode")
        .header(ContentType::Form)
        .body("failing=on")
        .dispatch();
    assert_eq!(switched.status(), Status::SeeOther);
    // The form cannot send an operator elsewhere.
    let elsewhere = client
        .post("/outbox/login")
        .header(ContentType::Form)
        .body(format!(
            "token={ADMIN_TOKEN}&next=https%3A%2F%2Fevil.example"
        ))
        .dispatch();
    assert_eq!(elsewhere.headers().get_one("location"), Some("/outbox/"));
}

#[test]
fn the_receiver_logs_bounded_lines_and_keeps_the_latest() {
    let db = TempDb::new("receiver-bounds");
    let client = local_client(&db);
    let huge_id = "i".repeat(10_000);
    let huge_body = format!("{{\"type\":\"{}\"}}", "t".repeat(900_000));
    let response = client
        .post("/receiver/hooks")
        .header(Header::new("webhook-id", huge_id))
        .body(huge_body)
        .dispatch();
    assert_eq!(response.status(), Status::Unauthorized, "unsigned");
    for i in 0..outbox_example_blog::LOGGED_DELIVERIES + 5 {
        client
            .post("/receiver/hooks")
            .header(Header::new("webhook-id", format!("junk-{i}")))
            .body("junk")
            .dispatch();
    }
    let mut conn: outbox_example_blog::db::AnyConnection = outbox_diesel::establish(&db.0).unwrap();
    let log = outbox_example_blog::db::recent_deliveries(&mut conn, 100_000).unwrap();
    assert_eq!(log.len() as i64, outbox_example_blog::LOGGED_DELIVERIES);
    assert!(
        log.iter().all(|d| !d.webhook_id.starts_with("iii")),
        "the oldest went first"
    );
    assert_eq!(
        log[0].webhook_id,
        format!("junk-{}", outbox_example_blog::LOGGED_DELIVERIES + 4)
    );
}

#[test]
fn a_long_line_is_cut_and_marked() {
    let db = TempDb::new("receiver-cut");
    let client = local_client(&db);
    client
        .post("/receiver/hooks")
        .header(Header::new("webhook-id", "é".repeat(1_000)))
        .body(format!("{{\"type\":\"{}\"}}", "t".repeat(900_000)))
        .dispatch();
    let mut conn: outbox_example_blog::db::AnyConnection = outbox_diesel::establish(&db.0).unwrap();
    let log = outbox_example_blog::db::recent_deliveries(&mut conn, 10).unwrap();
    let line = &log[0];
    assert!(
        line.body.len() < 2_200 && line.body.ends_with("bytes in all)"),
        "{}",
        line.body.len()
    );
    assert!(line.webhook_id.len() < 300 && line.webhook_id.starts_with('é'));
    assert!(line.message_type.len() < 300);
}

#[test]
fn only_a_receiver_on_this_machine_opens_loopback() {
    use outbox_example_blog::receiver_addresses;
    use std::net::IpAddr;
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    assert_eq!(receiver_addresses(Some("127.0.0.1")), [ip("127.0.0.1")]);
    assert_eq!(receiver_addresses(Some("[::1]")), [ip("::1")]);
    assert_eq!(
        receiver_addresses(Some("LOCALHOST")),
        [ip("127.0.0.1"), ip("::1")]
    );
    assert!(receiver_addresses(Some("mail.example.com")).is_empty());
    assert!(receiver_addresses(Some("10.0.0.7")).is_empty());
    assert!(receiver_addresses(Some("127.0.0.1.nip.io")).is_empty());
    assert!(receiver_addresses(None).is_empty());
}

#[test]
fn the_admin_page_needs_the_token() {
    let db = TempDb::new("admin");
    let client = local_client(&db);
    let anonymous = client.get("/outbox").dispatch();
    assert_eq!(anonymous.status(), Status::Unauthorized);
    let anonymous = anonymous.into_string().unwrap();
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
    for path in ["/outbox", "/outbox/", "/outbox/dead", "/outbox/messages"] {
        let page = client.get(path).dispatch();
        assert_eq!(page.status(), Status::Ok, "{path}");
        let html = page.into_string().unwrap();
        assert!(!html.contains(SECRET), "no secret on {path}");
    }
    let page = client.get("/outbox").dispatch().into_string().unwrap();
    assert!(page.contains("id=\"dead-count\">0<"), "{page}");
    // The pages' JSON works through Rocket too, and a too-large form is refused.
    let overview = client.get("/outbox/api/overview").dispatch();
    assert_eq!(overview.status(), Status::Ok);
    let overview: serde_json::Value =
        serde_json::from_str(&overview.into_string().unwrap()).unwrap();
    assert_eq!(overview["dead"], 0);
    let huge = client
        .post("/outbox/dead/purge")
        .header(ContentType::Form)
        .body(format!("count=0&type={}", "x".repeat(64 * 1024)))
        .dispatch();
    assert_eq!(huge.status(), Status::PayloadTooLarge);
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

/// Arrivals at the hooks of post 1 whose body mentions `needle`.
fn arrived(deliveries: &[outbox_example_blog::db::Delivery], hook: &str, needle: &str) -> usize {
    deliveries
        .iter()
        .filter(|d| d.outcome == format!("verified, at hook {hook}") && d.body.contains(needle))
        .count()
}

#[test]
fn a_reader_subscribes_a_webhook_and_watches_only_what_it_asked_for_arrive() {
    use outbox_diesel::subscription::{self, NewSubscription, Subscriptions};

    let server = Server::start("hooks");
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let subscribe = |events: &str| {
        let response = client
            .post(server.url("/posts/1/webhooks"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("events", events)]))
            .send()
            .unwrap();
        assert_eq!(response.status(), 303, "{events}");
        let to = response.headers()["location"].to_str().unwrap().to_owned();
        client.get(server.url(&to)).send().unwrap().text().unwrap()
    };
    let page = subscribe("comment.*");
    assert!(page.contains("id=\"notice\""), "{page}");
    let page = subscribe("comment.thankYou");
    assert!(page.contains("id=\"notice\""), "{page}");
    let refused = subscribe("comment.**");
    assert!(refused.contains("id=\"error\"") && refused.contains("Not subscribed"));

    let mut conn: outbox_example_blog::db::AnyConnection =
        outbox_diesel::establish(&server.db.0).unwrap();
    let listed = subscription::list(&mut conn, Some(Some("post-1"))).unwrap();
    assert_eq!(listed.len(), 2, "{listed:#?}");
    let hook_of = |types: &str| {
        let found = listed
            .iter()
            .find(|s| s.event_types == [types])
            .unwrap_or_else(|| panic!("a subscription to {types}: {listed:#?}"));
        (
            found.id.clone(),
            found.url.rsplit('/').next().unwrap().to_owned(),
        )
    };
    let (everything, everything_hook) = hook_of("comment.*");
    let (_, thanks_hook) = hook_of("comment.thankYou");
    // Another owner's subscription to the same events, at the blog's own receiver: the post's
    // events are not its.
    let stranger = Subscriptions::new()
        .allow_address(std::net::Ipv4Addr::LOCALHOST.into())
        .create(
            &mut conn,
            &NewSubscription::new(server.url("/receiver/readers/post-9-stranger"), ["*"])
                .secret(SECRET)
                .allow_http(),
        )
        .unwrap();

    post_comment(&client, &server, "Ada", "Hooked!");
    post_comment(&client, &server, "Bob", "Me too.");
    server.wait_for("both comments at the comment.* hook", |d| {
        arrived(d, &everything_hook, "Hooked!") >= 1 && arrived(d, &everything_hook, "Me too.") >= 1
    });
    // The worker had time to deliver the rest: Ada's and Bob's thank-yous reached the mail
    // receiver after their events were enqueued in the same transactions.
    server.wait_for("the thank-yous", |d| {
        delivered(d, "comment.thankYou", "bob@example.com") == 1
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = server.deliveries();
    let at_hook: Vec<_> = log
        .iter()
        .filter(|d| d.outcome == format!("verified, at hook {everything_hook}"))
        .collect();
    assert!(
        at_hook
            .iter()
            .all(|d| d.message_type == "comment.posted" && !d.body.contains("@example.com")),
        "only comment.posted events, without addresses: {at_hook:#?}"
    );
    let ada = at_hook.iter().position(|d| d.body.contains("Hooked!"));
    let bob = at_hook.iter().position(|d| d.body.contains("Me too."));
    assert!(ada < bob, "in the order posted: {at_hook:#?}");
    assert_eq!(
        arrived(&log, &thanks_hook, ""),
        0,
        "a hook for comment.thankYou takes no comment.posted: {log:#?}"
    );
    assert!(
        !log.iter().any(|d| d.outcome.contains("post-9-stranger")),
        "another owner's subscription got the post's events: {log:#?}"
    );

    let page = client
        .get(server.url("/posts/1/webhooks"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        page.contains(&everything) && page.contains("Hooked!"),
        "{page}"
    );
    assert!(!page.contains(&stranger.subscription.id), "{page}");

    // What is not signed with the blog's secret is refused and not shown.
    let forged = client
        .post(server.url(&format!("/receiver/readers/{everything_hook}")))
        .header("webhook-id", "msg_forged")
        .header("webhook-timestamp", "1")
        .header("webhook-signature", "v1,AAAA")
        .body(r#"{"type":"comment.posted","data":{"excerpt":"forged"}}"#)
        .send()
        .unwrap();
    assert_eq!(forged.status(), 401);
    assert!(!server
        .deliveries()
        .iter()
        .any(|d| d.body.contains("forged")));

    // A post's page removes its own subscriptions only.
    let remove = |id: &str| {
        let response = client
            .post(server.url("/posts/1/webhooks/remove"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("subscription", id)]))
            .send()
            .unwrap();
        assert_eq!(response.status(), 303);
    };
    remove(&stranger.subscription.id);
    assert!(subscription::get(&mut conn, &stranger.subscription.id)
        .unwrap()
        .is_some());
    remove(&everything);
    assert!(subscription::get(&mut conn, &everything).unwrap().is_none());
}
