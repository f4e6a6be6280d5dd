//! The operator pages of `outbox-admin` and the listings under them, on every backend: filters
//! and keyset pages that cover every message once, sign-in and cross-site refusals, bulk
//! actions that do only the count the operator confirmed, a message page that shows what the
//! message carries and escapes what it says, and the figures as JSON.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use outbox_admin::{Admin, Request, Response};
use outbox_diesel::admin::{self, ListOptions};
use outbox_diesel::destination::Answer;
use outbox_diesel::prelude::*;
use outbox_diesel::store::{
    ClaimLimit, ClaimToken, Exchange, Settlement, SharedDestinations, Store, SyncedDestination,
};
use outbox_diesel::{
    outbox_handler, Context, DieselStore, EnqueueOptions, MessageId, ProcessError,
};
use outbox_testkit::outbox::{dead, outcome, pending};
use outbox_testkit::{backend_tests, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const TOKEN: &str = "an-admin-token-for-the-tests";
const LEASE: Duration = Duration::from_secs(60);

#[outbox_handler("admin.mail")]
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    n: u32,
}

impl Handler for Mail {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

#[outbox_handler("admin.event")]
#[derive(Debug, Serialize, Deserialize)]
struct Event {
    n: u32,
}

impl Handler for Event {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

#[outbox_handler("admin.large")]
#[derive(Debug, Serialize, Deserialize)]
struct Large {
    text: String,
}

impl Handler for Large {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn pages<C: TestConnection>(pool: &TestPool<C>) -> Admin<outbox_diesel::OutboxManager<C>> {
    Admin::builder(pool.clone(), TOKEN)
        .base_path("/ops/outbox")
        .build()
        .unwrap()
}

/// The pages, given the application's subscription settings (they can make secrets).
fn pages_with_subscriptions<C: TestConnection>(
    pool: &TestPool<C>,
) -> Admin<outbox_diesel::OutboxManager<C>> {
    Admin::builder(pool.clone(), TOKEN)
        .base_path("/ops/outbox")
        .subscriptions(outbox_testkit::outbox::subscriptions())
        .build()
        .unwrap()
}

/// The `Cookie` header value a response's `Set-Cookie` asks for.
fn cookie_of(response: &Response) -> String {
    response
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("a Set-Cookie header")
        .to_owned()
}

/// A signed-in operator's session cookie.
fn sign_in<C: TestConnection>(admin: &Admin<outbox_diesel::OutboxManager<C>>) -> String {
    let response = admin.handle(
        &Request::new("POST", "/login")
            .header("sec-fetch-site", "same-origin")
            .body(format!("token={TOKEN}&next=%2Fops%2Foutbox%2Fdead")),
    );
    assert_eq!(response.status, 303, "{}", response.text());
    assert_eq!(response.header("location"), Some("/ops/outbox/dead"));
    cookie_of(&response)
}

fn get<C: TestConnection>(
    admin: &Admin<outbox_diesel::OutboxManager<C>>,
    cookie: &str,
    path: &str,
) -> Response {
    admin.handle(&Request::new("GET", path).header("cookie", cookie))
}

fn post<C: TestConnection>(
    admin: &Admin<outbox_diesel::OutboxManager<C>>,
    cookie: &str,
    path: &str,
    form: &str,
) -> Response {
    admin.handle(
        &Request::new("POST", path)
            .header("cookie", cookie)
            .header("sec-fetch-site", "same-origin")
            .body(form.to_owned()),
    )
}

fn json(response: &Response) -> Value {
    assert_eq!(
        response.header("content-type"),
        Some("application/json"),
        "{}",
        response.text()
    );
    serde_json::from_slice(&response.body).unwrap()
}

/// Claims every due message and settles each with `settle(message n, position)`.
fn settle_all<C: TestConnection>(pool: &TestPool<C>, settle: impl Fn(usize) -> Option<Settlement>) {
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1000), LEASE)
        .unwrap();
    let outcomes: Vec<_> = claimed
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let settlement = settle(i).unwrap_or(Settlement::Release);
            outcome(token, m, settlement)
        })
        .collect();
    store.settle(&outcomes).unwrap();
}

fn dead_letter(error: &str) -> Option<Settlement> {
    Some(Settlement::DeadLetter {
        error: error.to_owned(),
    })
}

fn listings_filter_and_page_by_position_covering_every_message_once<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    // 130 messages: mail and events alternating; every third keyed "k1", every fifth "k2"
    // (where not "k1"); the last ten delayed.
    for n in 0..130u32 {
        let mut options = EnqueueOptions::new();
        if n % 3 == 0 {
            options = options.ordering_key("k1");
        } else if n % 5 == 0 {
            options = options.ordering_key("k2");
        }
        if n >= 120 {
            options = options.delay(Duration::from_secs(3600));
        }
        if n % 2 == 0 {
            Mail { n }.enqueue_with(&mut conn, &options).unwrap();
        } else {
            Event { n }.enqueue_with(&mut conn, &options).unwrap();
        }
    }
    conn.batch_execute("UPDATE outbox_message SET attempts = 2 WHERE id % 7 = 0")
        .unwrap();
    let every: Vec<i64> = admin::pending_messages(&mut conn, &ListOptions::new().limit(1000))
        .unwrap()
        .iter()
        .map(|m| m.position)
        .collect();
    assert_eq!(every.len(), 130);

    let walk = |options: ListOptions| -> Vec<admin::PendingMessage> {
        let mut seen = Vec::new();
        let mut options = options.limit(17);
        loop {
            let page = admin::pending_messages(&mut *pool.get().unwrap(), &options).unwrap();
            let full = page.len() == 17;
            seen.extend(page);
            match seen.last() {
                Some(last) if full => options = options.after(last.position),
                _ => return seen,
            }
        }
    };
    let all = walk(ListOptions::new());
    assert_eq!(
        all.iter().map(|m| m.position).collect::<Vec<_>>(),
        every,
        "pages of 17 cover every message once, in order"
    );
    let mail = walk(ListOptions::new().message_type("admin.mail"));
    assert_eq!(mail.len(), 65);
    assert!(mail.iter().all(|m| m.message_type == "admin.mail"));
    let k2 = walk(ListOptions::new().ordering_key("k2"));
    let expected_k2 = (0..130).filter(|n| n % 3 != 0 && n % 5 == 0).count();
    assert_eq!(k2.len(), expected_k2);
    assert!(k2.iter().all(|m| m.ordering_key.as_deref() == Some("k2")));
    let tried = walk(ListOptions::new().min_attempts(1));
    assert_eq!(
        tried.iter().map(|m| m.position).collect::<Vec<_>>(),
        every
            .iter()
            .copied()
            .filter(|p| p % 7 == 0)
            .collect::<Vec<_>>()
    );
    // Due now: not delayed, and not behind an earlier message of its key once a claim has
    // parked those (the claim below parks them and releases what it took).
    settle_all(&pool, |_| None);
    let due = walk(ListOptions::new().due_only());
    assert!(!due.is_empty());
    assert!(due
        .iter()
        .all(|m| !m.parked && m.next_attempt_at <= std::time::SystemTime::now()));
    let due_keyed: Vec<_> = due
        .iter()
        .filter_map(|m| m.ordering_key.as_deref())
        .collect();
    assert_eq!(
        due_keyed.iter().filter(|k| **k == "k1").count(),
        1,
        "one head per key is due: {due_keyed:?}"
    );
    assert!(
        due.len() < 120 - 1,
        "the delayed and parked ones are not due"
    );

    // Dead letters: filter by type and key, pages by position.
    settle_all(&pool, |i| {
        (i % 2 == 0).then(|| dead_letter("gave up")).flatten()
    });
    let letters = dead(&pool);
    assert!(!letters.is_empty());
    let mut paged = Vec::new();
    let mut options = ListOptions::new().limit(3);
    loop {
        let page = admin::dead_letters(&mut conn, &options).unwrap();
        let full = page.len() == 3;
        paged.extend(page.iter().map(|d| d.position));
        match page.last() {
            Some(last) if full => options = options.after(last.position),
            _ => break,
        }
    }
    assert_eq!(
        paged,
        letters.iter().map(|d| d.position).collect::<Vec<_>>()
    );
    let keyed = admin::dead_letters(&mut conn, &ListOptions::new().ordering_key("k1")).unwrap();
    assert_eq!(
        keyed.len(),
        letters
            .iter()
            .filter(|d| d.ordering_key.as_deref() == Some("k1"))
            .count()
    );
}

fn the_pages_need_the_token_and_refuse_cross_site_posts<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    Mail { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    settle_all(&pool, |_| dead_letter("for the sign-in test"));
    let position = dead(&pool)[0].position;
    let admin = pages(&pool);

    // Nothing without signing in: the page asks for the token, the JSON says how.
    let page = admin.handle(&Request::new("GET", "/dead"));
    assert_eq!(page.status, 401);
    assert!(page.text().contains("name=\"token\""));
    assert!(
        page.text().contains("value=\"/ops/outbox/dead\""),
        "back here after"
    );
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert!(page.header("content-security-policy").is_some_and(|csp| csp
        .contains("default-src 'none'")
        && csp.contains("frame-ancestors 'none'")));
    assert_eq!(
        admin.handle(&Request::new("GET", "/api/overview")).status,
        401
    );
    let purge_unsigned = post(&admin, "", &format!("/dead/{position}/purge"), "");
    assert_eq!(purge_unsigned.status, 401);
    let wrong = admin.handle(
        &Request::new("POST", "/login")
            .header("sec-fetch-site", "same-origin")
            .body("token=nope&next=%2F%2Fevil.example"),
    );
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(
        wrong.text().contains("value=\"/ops/outbox/\""),
        "no open redirect"
    );
    let forged = get(&admin, "outbox_admin=99999999999.AAAA", "/");
    assert_eq!(forged.status, 401);

    // The token signs in: an HttpOnly, SameSite=Strict cookie for the pages' path.
    let set_cookie = admin
        .handle(
            &Request::new("POST", "/login")
                .header("sec-fetch-site", "same-origin")
                .body(format!("token={TOKEN}")),
        )
        .header("set-cookie")
        .unwrap()
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ops/outbox"] {
        assert!(
            set_cookie.contains(attribute),
            "{attribute} in {set_cookie}"
        );
    }
    let cookie = sign_in(&admin);
    let overview = get(&admin, &cookie, "/");
    assert_eq!(overview.status, 200);
    assert!(
        overview.text().contains("id=\"dead-count\">1<"),
        "{}",
        overview.text()
    );

    // Another site's form, with the operator's cookie: refused, nothing purged.
    for (name, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "http://evil.example"),
    ] {
        let cross = admin.handle(
            &Request::new("POST", &format!("/dead/{position}/purge"))
                .header("cookie", &cookie)
                .header("host", "127.0.0.1:8000")
                .header(name, value),
        );
        assert_eq!(cross.status, 403, "{name}");
    }
    let cross_login = admin.handle(
        &Request::new("POST", "/login")
            .header("sec-fetch-site", "cross-site")
            .body(format!("token={TOKEN}")),
    );
    assert_eq!(cross_login.status, 403, "no login CSRF");
    assert_eq!(dead(&pool).len(), 1);

    // The bearer token reads the JSON, but does not open the HTML pages.
    let bearer =
        Request::new("GET", "/api/dead").header("authorization", &format!("Bearer {TOKEN}"));
    assert_eq!(
        json(&admin.handle(&bearer))["dead_letters"][0]["position"],
        position
    );
    let bearer_page =
        Request::new("GET", "/dead").header("authorization", &format!("Bearer {TOKEN}"));
    assert_eq!(admin.handle(&bearer_page).status, 401);

    // Signing out clears the cookie; another process's admin does not know this one's.
    let out = post(&admin, &cookie, "/logout", "");
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    let other = pages(&pool);
    assert_eq!(get(&other, &cookie, "/").status, 401);
    assert!(
        !admin.is_signed_in(&Request::new("GET", "/x").header("cookie", &cookie)),
        "signing out ended the session, not only this browser's copy of the cookie"
    );
}

fn bulk_actions_do_only_the_count_the_operator_confirmed<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    for n in 0..5 {
        if n < 3 {
            Mail { n }.enqueue(&mut conn).unwrap();
        } else {
            Event { n }.enqueue(&mut conn).unwrap();
        }
    }
    settle_all(&pool, |_| dead_letter("gave up"));
    let admin = pages(&pool);
    let cookie = sign_in(&admin);

    let ask = get(
        &admin,
        &cookie,
        "/dead/confirm?action=requeue&type=admin.mail",
    );
    assert_eq!(ask.status, 200);
    assert!(
        ask.text()
            .contains("Re-queue <b>3</b> dead letters of type <b>admin.mail</b>"),
        "{}",
        ask.text()
    );
    assert!(ask.text().contains("name=\"count\" value=\"3\""));

    // One more mail dead-letters after the operator read "3": nothing happens, the page says
    // so with the new count.
    Mail { n: 9 }.enqueue(&mut conn).unwrap();
    settle_all(&pool, |_| dead_letter("gave up"));
    let stale = post(&admin, &cookie, "/dead/requeue", "type=admin.mail&count=3");
    assert_eq!(stale.status, 409);
    assert!(stale.text().contains("id=\"changed\""), "{}", stale.text());
    assert!(stale.text().contains("name=\"count\" value=\"4\""));
    assert_eq!(dead(&pool).len(), 6);
    assert!(pending(&pool).is_empty());

    let done = post(&admin, &cookie, "/dead/requeue", "type=admin.mail&count=4");
    assert_eq!(done.status, 303, "{}", done.text());
    assert_eq!(done.header("location"), Some("/ops/outbox/dead"));
    let flash = cookie_of(&done);
    let after = get(&admin, &format!("{cookie}; {flash}"), "/dead");
    assert!(
        after
            .text()
            .contains("Re-queued 4 dead letters of type admin.mail."),
        "{}",
        after.text()
    );
    assert!(
        after.header("set-cookie").unwrap().contains("Max-Age=0"),
        "shown once"
    );
    assert_eq!(pending(&pool).len(), 4);
    assert!(pending(&pool)
        .iter()
        .all(|m| m.message_type == "admin.mail"));
    assert_eq!(dead(&pool).len(), 2);

    // Purge of every type, one by one and in bulk; the confirmation states every type's count.
    let ask = get(&admin, &cookie, "/dead/confirm?action=purge");
    assert!(
        ask.text()
            .contains("Purge <b>2</b> dead letters of every type"),
        "{}",
        ask.text()
    );
    let first = dead(&pool)[0].position;
    assert_eq!(
        post(&admin, &cookie, &format!("/dead/{first}/purge"), "").status,
        303
    );
    assert_eq!(
        post(&admin, &cookie, "/dead/purge", "type=&count=2").status,
        409
    );
    assert_eq!(post(&admin, &cookie, "/dead/purge", "count=1").status, 303);
    assert!(dead(&pool).is_empty());
    assert_eq!(
        pending(&pool).len(),
        4,
        "purging dead letters leaves the pending alone"
    );
    let nothing = get(&admin, &cookie, "/dead/confirm?action=requeue");
    assert!(nothing.text().contains("There are no dead letters"));
    let gone = post(&admin, &cookie, &format!("/dead/{first}/requeue"), "");
    let shown = get(&admin, &format!("{cookie}; {}", cookie_of(&gone)), "/dead");
    assert!(shown.text().contains("is gone already"));
}

fn a_message_page_shows_what_it_carries_and_escapes_what_it_says<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let kept = Mail { n: 7 }
        .enqueue_with(
            &mut conn,
            &EnqueueOptions::new()
                .ordering_key("member-7")
                .header("traceparent", traceparent),
        )
        .unwrap();
    let failed = Event { n: 8 }.enqueue(&mut conn).unwrap();
    settle_all(&pool, |i| {
        (i == 1)
            .then(|| dead_letter("HTTP 500: <script>alert(1)</script>\u{1b}[2J"))
            .flatten()
    });
    let admin = pages(&pool);
    let cookie = sign_in(&admin);

    let page = get(&admin, &cookie, &format!("/messages/{kept}"));
    assert_eq!(page.status, 200);
    let html = page.text();
    assert!(html.contains(&format!("<code id=\"message-id\">{kept}</code>")));
    assert!(
        html.contains("{\n  &quot;n&quot;: 7\n}"),
        "payload pretty-printed: {html}"
    );
    assert!(html.contains(&format!(
        "<td>traceparent</td><td><code>{traceparent}</code>"
    )));
    assert!(html.contains("member-7"));

    let page = get(&admin, &cookie, &format!("/messages/{failed}"));
    let html = page.text();
    assert!(html.contains("dead letter"));
    assert!(
        html.contains("HTTP 500: &lt;script&gt;alert(1)&lt;/script&gt;\\u{1b}[2J"),
        "{html}"
    );
    assert!(!html.contains("<script>"));
    assert!(html.contains("class=\"requeue\""));

    let api = json(&get(&admin, &cookie, &format!("/api/messages/{failed}")));
    assert_eq!(api["state"], "dead");
    assert_eq!(api["message"]["message_type"], "admin.event");
    let api = json(&get(&admin, &cookie, &format!("/api/messages/{kept}")));
    assert_eq!(api["state"], "pending");
    assert_eq!(api["message"]["headers"]["traceparent"], traceparent);
    // One serialized form: what `outbox --json show` prints (issue 25, item 17).
    let Some(admin::FoundMessage::Pending(found)) = admin::find_message(&mut conn, kept).unwrap()
    else {
        panic!("{kept} is pending");
    };
    assert_eq!(api["message"], serde_json::to_value(&found).unwrap());

    let missing = outbox_diesel::MessageId::new();
    assert_eq!(
        get(&admin, &cookie, &format!("/messages/{missing}")).status,
        404
    );
    assert_eq!(get(&admin, &cookie, "/messages/not-a-uuid").status, 400);
    let found = get(&admin, &cookie, &format!("/find?id=+{kept}+"));
    assert_eq!(found.status, 303);
    assert_eq!(
        found.header("location"),
        Some(format!("/ops/outbox/messages/{kept}").as_str())
    );
    assert_eq!(get(&admin, &cookie, "/find?id=%3Cb%3E").status, 400);
}

fn the_overview_shows_backlog_types_and_blocked_keys<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    for n in 0..4 {
        Mail { n }
            .enqueue_with(&mut conn, &EnqueueOptions::new().ordering_key("tenant <1>"))
            .unwrap();
    }
    Event { n: 9 }.enqueue(&mut conn).unwrap();
    // The head of "tenant <1>" fails and waits an hour: its key is blocked, three behind it.
    settle_all(&pool, |i| {
        (i == 0).then(|| Settlement::Retry {
            delay: Duration::from_secs(3600),
            error: "503 from the mail service".into(),
        })
    });
    let settled = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let admin = {
        let settled = settled.clone();
        Admin::builder(pool.clone(), TOKEN)
            .worker_stats(move || {
                let mut stats = outbox_diesel::WorkerStats::default();
                stats.succeeded = settled.load(std::sync::atomic::Ordering::SeqCst);
                stats
            })
            .build()
            .unwrap()
    };
    let cookie = {
        let response = admin.handle(
            &Request::new("POST", "/login")
                .header("sec-fetch-site", "same-origin")
                .body(format!("token={TOKEN}")),
        );
        cookie_of(&response)
    };
    let overview = json(&get(&admin, &cookie, "/api/overview"));
    assert_eq!(overview["pending"], 5);
    assert_eq!(overview["dead"], 0);
    assert_eq!(
        overview["settled_per_second"],
        Value::Null,
        "one sample: no rate yet"
    );
    assert_eq!(overview["samples"].as_array().unwrap().len(), 1);
    let types: Vec<(&str, u64)> = overview["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["message_type"].as_str().unwrap(),
                t["pending"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(types.contains(&("admin.mail", 4)) && types.contains(&("admin.event", 1)));

    let blocked = json(&get(&admin, &cookie, "/api/blocked"));
    let keys = blocked["blocked_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["ordering_key"], "tenant <1>");
    assert_eq!(keys[0]["waiting"], 3);
    assert_eq!(keys[0]["last_error"], "503 from the mail service");

    let html = get(&admin, &cookie, "/").text();
    assert!(html.contains("class=\"blocked-key\""));
    assert!(html.contains("tenant &lt;1&gt;") && !html.contains("tenant <1>"));
    assert!(
        html.contains("href=\"/outbox/messages?key=tenant+%3C1%3E\""),
        "{html}"
    );
    assert!(html.contains("<meta http-equiv=\"refresh\" content=\"10\">"));
    assert!(
        html.contains("id=\"settled-rate\">…<"),
        "measuring until a second sample"
    );

    let bad = admin.handle(
        &Request::new("GET", "/api/messages?min_attempts=lots")
            .header("authorization", &format!("Bearer {TOKEN}")),
    );
    assert_eq!(bad.status, 400);
    let listed = json(&get(
        &admin,
        &cookie,
        "/api/messages?key=tenant+%3C1%3E&min_attempts=1",
    ));
    assert_eq!(listed["messages"].as_array().unwrap().len(), 1);
    assert_eq!(listed["next_after"], Value::Null);
}

#[test]
fn short_tokens_and_odd_base_paths_are_refused() {
    let Some(db) = TestDb::new(outbox_testkit::Backend::Sqlite) else {
        return;
    };
    let pool = db.pool::<diesel::SqliteConnection>(1);
    let short = Admin::builder(pool.clone(), "short").build().unwrap_err();
    assert!(short.to_string().contains("at least 16"), "{short}");
    for path in ["outbox", "/outbox/", "/out\nbox", "/a;b"] {
        let error = Admin::builder(pool.clone(), TOKEN).base_path(path).build();
        assert!(error.is_err(), "{path:?}");
    }
}

/// Issue 25, item 11: a page of 50 messages of 4 MiB each was about 200 MiB per request.
fn listings_read_payload_previews_and_a_message_its_whole_payload<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    // Characters of one, two, three and four bytes: a preview cut by bytes would split them.
    let text: String = "aé€😀".repeat(64 * 1024);
    for _ in 0..55 {
        Large { text: text.clone() }.enqueue(&mut conn).unwrap();
    }
    Event { n: 1 }.enqueue(&mut conn).unwrap();
    let preview_chars = admin::PREVIEW_CHARS as usize;
    // As stored: PostgreSQL's jsonb writes the text its own way.
    let by_default = admin::pending_messages(&mut conn, &ListOptions::new().limit(1)).unwrap();
    let whole = by_default[0].payload.clone();
    assert!(
        !by_default[0].payload_truncated,
        "whole unless a preview is asked for"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&whole).unwrap()["text"],
        text.as_str()
    );

    // The library: a preview is the payload's first characters, and says it was cut.
    let listed = admin::pending_messages(
        &mut conn,
        &ListOptions::new()
            .limit(100)
            .payload_preview(admin::PREVIEW_CHARS),
    )
    .unwrap();
    assert_eq!(listed.len(), 56);
    for m in &listed[..55] {
        assert!(m.payload_truncated);
        assert_eq!(m.payload.chars().count(), preview_chars);
        assert!(
            whole.starts_with(&m.payload),
            "the payload's first characters"
        );
    }
    assert!(!listed[55].payload_truncated, "a short payload is whole");
    assert_eq!(
        serde_json::from_str::<Value>(&listed[55].payload).unwrap(),
        serde_json::json!({ "n": 1 })
    );
    let none = admin::pending_messages(&mut conn, &ListOptions::new().payload_preview(0)).unwrap();
    assert!(none
        .iter()
        .all(|m| m.payload.is_empty() && m.payload_truncated));

    let admin = pages(&pool);
    let cookie = sign_in(&admin);
    let page = get(&admin, &cookie, "/api/messages");
    assert!(
        page.body.len() < 100_000,
        "a page of 50 previews, not 50 payloads of {} bytes: {} bytes",
        whole.len(),
        page.body.len()
    );
    let listed = json(&page);
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 50);
    assert_eq!(messages[0]["payload_truncated"], true);
    assert!(messages[0].get("payload").is_none());
    let preview = messages[0]["payload_preview"].as_str().unwrap();
    assert_eq!(preview.chars().count(), preview_chars);
    let id = messages[0]["message_id"].as_str().unwrap();
    let one = json(&get(&admin, &cookie, &format!("/api/messages/{id}")));
    assert_eq!(one["message"]["payload_truncated"], false);
    assert_eq!(one["message"]["payload"]["text"], text.as_str());
    assert!(get(&admin, &cookie, "/messages").body.len() < 100_000);

    // Dead letters: the same previews in the JSON and on the page, marked as cut.
    settle_all(&pool, |_| dead_letter("HTTP 500"));
    let page = get(&admin, &cookie, "/api/dead");
    assert!(page.body.len() < 100_000, "{} bytes", page.body.len());
    let letters = json(&page);
    let letters = letters["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 50);
    assert_eq!(letters[0]["payload_truncated"], true);
    let html = get(&admin, &cookie, "/dead");
    assert!(html.body.len() < 100_000, "{} bytes", html.body.len());
    let last_shown = whole.chars().nth(preview_chars - 1).unwrap();
    assert!(
        html.text().contains(&format!("{last_shown}…</pre>")),
        "cut, and marked so"
    );
}

/// Issue 25, item 15: a copied cookie stayed valid for 12 hours after sign-out, and each
/// replica signed cookies with a key of its own.
fn signing_out_ends_the_session_on_every_replica<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let key = "a session key from the configuration, 48 bytes..";
    let replica = || {
        Admin::builder(pool.clone(), TOKEN)
            .base_path("/ops/outbox")
            .session_key(key)
            .build()
            .unwrap()
    };
    let (a, b) = (replica(), replica());
    let cookie = sign_in(&a);
    let copied = cookie.clone();
    assert_eq!(get(&a, &cookie, "/api/overview").status, 200);
    assert_eq!(
        get(&b, &cookie, "/api/overview").status,
        200,
        "one key: one session"
    );
    assert_eq!(
        get(&pages(&pool), &cookie, "/api/overview").status,
        401,
        "a replica without the key does not know the session"
    );
    let other = sign_in(&a);

    let out = post(&a, &cookie, "/logout", "");
    assert_eq!(out.status, 303, "{}", out.text());
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    for replica in [&a, &b] {
        assert_eq!(
            get(replica, &copied, "/api/overview").status,
            401,
            "the copy is refused"
        );
        assert_eq!(get(replica, &copied, "/dead").status, 401);
        assert_eq!(
            get(replica, &other, "/api/overview").status,
            200,
            "other sessions stay"
        );
    }
    assert!(!b.is_signed_in(&Request::new("GET", "/").header("cookie", &copied)));
    assert!(b.is_signed_in(&Request::new("GET", "/").header("cookie", &other)));

    // Signing out twice, or with a forged cookie, changes nothing and fails nothing.
    assert_eq!(post(&b, &copied, "/logout", "").status, 303);
    assert_eq!(post(&b, "outbox_admin=1.x.y", "/logout", "").status, 303);
    assert_eq!(get(&b, &other, "/api/overview").status, 200);

    let short = Admin::builder(pool.clone(), TOKEN)
        .session_key([0u8; 16])
        .build();
    assert!(
        matches!(
            short,
            Err(outbox_admin::AdminError::SessionKeyTooShort { length: 16 })
        ),
        "{short:?}"
    );
}

fn operators_pause_and_resume_types_and_destinations_from_the_pages<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    Mail { n: 1 }.enqueue(&mut conn).unwrap();
    Event { n: 2 }.enqueue(&mut conn).unwrap();
    let admin = pages(&pool);
    let cookie = sign_in(&admin);
    let html = get(&admin, &cookie, "/").text();
    assert!(
        html.contains(
            "action=\"/ops/outbox/types/admin%2Email/pause\"><button class=\"quiet pause-type\">"
        ),
        "{html}"
    );
    assert!(!html.contains("id=\"paused\""), "nothing paused yet");

    // A name with what a path or the page must not take literally.
    let odd = "tenant/<1> & co";
    let odd_path = "tenant%2F%3C1%3E%20%26%20co";
    let mut flash = String::new();
    for path in [
        "/types/admin.mail/pause".to_owned(),
        format!("/destinations/{odd_path}/pause"),
    ] {
        let response = post(&admin, &cookie, &path, "");
        assert_eq!(response.status, 303, "{path}: {}", response.text());
        assert_eq!(response.header("location"), Some("/ops/outbox/"));
        flash = cookie_of(&response);
    }
    let pauses = admin::pauses(&mut conn).unwrap();
    let names: Vec<&str> = pauses.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, [odd, "admin.mail"]);
    assert!(
        pauses[1]
            .reason
            .starts_with("paused from the admin pages by"),
        "{pauses:?}"
    );

    let html = get(&admin, &format!("{cookie}; {flash}"), "/").text();
    assert!(html.contains("id=\"paused\""), "{html}");
    assert!(
        html.contains("tenant/&lt;1&gt; &amp; co") && !html.contains(odd),
        "{html}"
    );
    assert!(html.contains("class=\"quiet resume-type\""), "{html}");
    assert!(
        html.contains("class=\"quiet resume-destination\""),
        "{html}"
    );
    assert!(
        html.contains("Paused destination tenant/&lt;1&gt; &amp; co: within a few seconds"),
        "the flash says what happened: {html}"
    );
    let api = json(&get(&admin, &cookie, "/api/paused"));
    assert_eq!(
        api["paused"],
        serde_json::to_value(admin::pauses(&mut conn).unwrap()).unwrap()
    );
    assert_eq!(
        json(&get(&admin, &cookie, "/api/overview"))["paused"],
        api["paused"]
    );

    // Cross-site and signed-out requests change nothing.
    let forged = admin.handle(
        &Request::new("POST", "/types/admin.event/pause")
            .header("cookie", &cookie)
            .header("sec-fetch-site", "cross-site"),
    );
    assert_eq!(forged.status, 403, "{}", forged.text());
    let anonymous = admin.handle(
        &Request::new("POST", "/types/admin.event/pause").header("sec-fetch-site", "same-origin"),
    );
    assert_eq!(anonymous.status, 401);
    assert_eq!(admin::pauses(&mut conn).unwrap().len(), 2);
    let bad = post(&admin, &cookie, "/types/a%0Ab/pause", "");
    assert_eq!(bad.status, 400, "{}", bad.text());

    for path in [
        "/types/admin.mail/resume".to_owned(),
        format!("/destinations/{odd_path}/resume"),
    ] {
        assert_eq!(post(&admin, &cookie, &path, "").status, 303, "{path}");
    }
    assert!(admin::pauses(&mut conn).unwrap().is_empty());
    let again = post(&admin, &cookie, "/types/admin.mail/resume", "");
    assert_eq!(again.status, 303);
    let html = get(&admin, &format!("{cookie}; {}", cookie_of(&again)), "/").text();
    assert!(html.contains("was not paused"), "{html}");
    assert!(!html.contains("id=\"paused\""));
}

/// Operators see, add, disable, enable, rotate and remove subscriptions from the pages: a
/// secret shows once, when made; the pages refuse to make one without the application's
/// settings; a cross-site request changes nothing.
fn operators_manage_subscriptions_from_the_pages<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let admin = pages_with_subscriptions(&pool);
    let cookie = sign_in(&admin);
    let added = post(
        &admin,
        &cookie,
        "/subscriptions",
        "url=https%3A%2F%2F127.0.0.1%2Fhooks&event_types=invoice.*%2C+order.paid&owner=42",
    );
    assert_eq!(added.status, 200, "{}", added.text());
    let page = added.text();
    let secret = page
        .split("<code id=\"secret\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("the secret, shown once")
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{page}");
    let listed = outbox_diesel::subscription::list(&mut pool.get().unwrap(), None).unwrap();
    assert_eq!(listed.len(), 1);
    let id = listed[0].id.clone();
    assert_eq!(listed[0].event_types, ["invoice.*", "order.paid"]);

    let page = get(&admin, &cookie, "/subscriptions").text();
    assert!(page.contains(&id) && page.contains("invoice.*"), "{page}");
    assert!(
        !page.contains(&secret[6..]),
        "the listing never shows a secret"
    );
    let api = json(&get(&admin, &cookie, "/api/subscriptions"));
    assert_eq!(api["subscriptions"][0]["id"], id.as_str());
    assert!(!api.to_string().contains(&secret[6..]));

    let disabled = post(&admin, &cookie, &format!("/subscriptions/{id}/disable"), "");
    assert_eq!(disabled.status, 303, "{}", disabled.text());
    let get_one = || {
        outbox_diesel::subscription::get(&mut pool.get().unwrap(), &id)
            .unwrap()
            .unwrap()
    };
    assert!(!get_one().enabled);
    // Cross-site: refused, nothing changes.
    let forged = admin.handle(
        &Request::new("POST", &format!("/subscriptions/{id}/enable"))
            .header("cookie", &cookie)
            .header("sec-fetch-site", "cross-site"),
    );
    assert_eq!(forged.status, 403);
    assert!(!get_one().enabled);
    post(&admin, &cookie, &format!("/subscriptions/{id}/enable"), "");
    assert!(get_one().enabled);

    let rotated = post(
        &admin,
        &cookie,
        &format!("/subscriptions/{id}/rotate-secret"),
        "",
    );
    assert_eq!(rotated.status, 200);
    assert!(rotated.text().contains("whsec_") && !rotated.text().contains(&secret[6..]));
    assert!(get_one().previous_secret_until.is_some());

    let refused = post(
        &admin,
        &cookie,
        "/subscriptions",
        "url=http%3A%2F%2Fexample.com&event_types=*",
    );
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("http://"));

    let removed = post(&admin, &cookie, &format!("/subscriptions/{id}/remove"), "");
    assert_eq!(removed.status, 303);
    assert!(
        outbox_diesel::subscription::get(&mut pool.get().unwrap(), &id)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        post(&admin, &cookie, &format!("/subscriptions/{id}/remove"), "").status,
        404
    );

    // Pages without the application's settings list and switch, but make no secret.
    let plain = pages(&pool);
    let cookie = sign_in(&plain);
    let no_settings = post(
        &plain,
        &cookie,
        "/subscriptions",
        "url=https%3A%2F%2Fexample.com&event_types=*",
    );
    assert_eq!(no_settings.status, 400);
    assert!(no_settings.text().contains("AdminBuilder::subscriptions"));
}

#[derive(diesel::QueryableByName, Debug)]
struct CancelReason {
    #[diesel(sql_type = diesel::sql_types::Text)]
    reason: String,
}

/// The reasons kept with cancelled messages.
fn cancel_reasons(db: &TestDb) -> Vec<String> {
    let rows: Vec<CancelReason> = outbox_testkit::with_connection!(db.backend(), Conn => {
        diesel::RunQueryDsl::load(
            diesel::sql_query("SELECT reason FROM outbox_cancelled ORDER BY id"),
            &mut db.connect::<Conn>(),
        )
        .unwrap()
    });
    rows.into_iter().map(|row| row.reason).collect()
}

/// The text a redirect's flash cookie shows on the page it leads to.
fn flash_after<C: TestConnection>(
    admin: &Admin<outbox_diesel::OutboxManager<C>>,
    cookie: &str,
    response: &Response,
) -> String {
    assert_eq!(response.status, 303, "{}", response.text());
    let location = response.header("location").expect("a redirect").to_owned();
    let path = location.trim_start_matches("/ops/outbox");
    let flash = cookie_of(response);
    get(admin, &format!("{cookie}; {flash}"), path).text()
}

/// Operators cancel waiting messages from a message's page, from the pending page of a type,
/// from a subscription's row and through the JSON API: a cancel without a reason or a
/// selection changes nothing, a cross-site one is refused, a message being delivered is left
/// alone and counted, and each cancelled message is kept with the reason given.
fn operators_cancel_waiting_messages_from_the_pages_and_the_api<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let mut conn = pool.get().unwrap();
    let mut mails = Vec::new();
    for n in 0..3 {
        mails.push(Mail { n }.enqueue(&mut conn).unwrap());
    }
    for n in 0..2 {
        Event { n }.enqueue(&mut conn).unwrap();
    }
    let admin = pages(&pool);
    let cookie = sign_in(&admin);
    let types = |pool: &TestPool<C>| -> Vec<String> {
        pending(pool).into_iter().map(|m| m.message_type).collect()
    };

    // One message, from its page: the form asks for a reason, and nothing happens without one.
    let page = get(&admin, &cookie, &format!("/messages/{}", mails[0])).text();
    assert!(
        page.contains(&format!(
            "action=\"/ops/outbox/messages/{}/cancel\"",
            mails[0]
        )) && page.contains("name=\"reason\""),
        "{page}"
    );
    let no_reason = post(
        &admin,
        &cookie,
        &format!("/messages/{}/cancel", mails[0]),
        "",
    );
    assert_eq!(no_reason.status, 400, "{}", no_reason.text());
    assert!(
        no_reason.text().contains("give a reason"),
        "{}",
        no_reason.text()
    );
    let forged = admin.handle(
        &Request::new("POST", &format!("/messages/{}/cancel", mails[0]))
            .header("cookie", &cookie)
            .header("sec-fetch-site", "cross-site")
            .body("reason=forged".to_owned()),
    );
    assert_eq!(forged.status, 403);
    assert_eq!(pending(&pool).len(), 5, "nothing was cancelled yet");
    let one = post(
        &admin,
        &cookie,
        &format!("/messages/{}/cancel", mails[0]),
        "reason=sent+by+mistake",
    );
    assert!(flash_after(&admin, &cookie, &one).contains("Cancelled 1 message (sent by mistake)."));
    assert_eq!(pending(&pool).len(), 4);
    assert!(pending(&pool).iter().all(|m| m.message_id != mails[0]));
    let gone = get(&admin, &cookie, &format!("/messages/{}", mails[0]));
    assert_eq!(gone.status, 404);
    assert!(gone.text().contains("cancelled"), "{}", gone.text());

    // Every waiting message of a type, from the pending page filtered by it.
    let listing = get(&admin, &cookie, "/messages?type=admin.event").text();
    assert!(listing.contains("id=\"cancel-type\""), "{listing}");
    assert!(!get(&admin, &cookie, "/messages")
        .text()
        .contains("id=\"cancel-type\""));
    let of_type = post(
        &admin,
        &cookie,
        "/messages/cancel",
        "type=admin.event&reason=retired+event",
    );
    assert_eq!(
        of_type.header("location"),
        Some("/ops/outbox/messages?type=admin.event")
    );
    assert!(
        flash_after(&admin, &cookie, &of_type).contains("Cancelled 2 messages (retired event).")
    );
    assert_eq!(types(&pool), ["admin.mail", "admin.mail"]);

    // The JSON API, with the bearer token: a message being delivered is left alone and counted.
    let store = DieselStore::new(pool.clone());
    let held = store
        .claim(ClaimToken::new(), ClaimLimit::messages(1), LEASE)
        .unwrap();
    assert_eq!(held.len(), 1);
    let api = |form: &str| {
        admin.handle(
            &Request::new("POST", "/api/cancel")
                .header("authorization", &format!("Bearer {TOKEN}"))
                .body(form.to_owned()),
        )
    };
    let nothing_named = api("reason=everything");
    assert_eq!(nothing_named.status, 400);
    assert!(json(&nothing_named)["error"]
        .as_str()
        .unwrap()
        .contains("name a message id"));
    let bad_age = api("type=admin.mail&older_than_seconds=soon&reason=x");
    assert_eq!(bad_age.status, 400);
    let too_young = json(&api(
        "type=admin.mail&older_than_seconds=3600&reason=old+ones",
    ));
    assert_eq!(
        (
            too_young["cancelled"].as_u64(),
            too_young["in_flight"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let answered = api("type=admin.mail&reason=mail+provider+replaced");
    assert_eq!(answered.status, 200);
    let answered = json(&answered);
    assert_eq!(answered["cancelled"], 1, "{answered}");
    assert_eq!(answered["in_flight"], 1, "{answered}");
    let left: Vec<_> = pending(&pool).into_iter().map(|m| m.message_id).collect();
    assert_eq!(
        left,
        [held[0].message_id],
        "only the message being delivered is left"
    );

    // A subscription's row: its waiting deliveries (none here), with the page's own answer.
    let admin = pages_with_subscriptions(&pool);
    let cookie = sign_in(&admin);
    let created = outbox_testkit::outbox::subscriptions()
        .create(
            &mut conn,
            &outbox_diesel::subscription::NewSubscription::new("https://127.0.0.1/hooks", ["*"]),
        )
        .unwrap();
    let id = created.subscription.id;
    let listed = get(&admin, &cookie, "/subscriptions").text();
    assert!(
        listed.contains(&format!("/subscriptions/{}/cancel", id.replace('-', "%2D"))),
        "{listed}"
    );
    let none = post(
        &admin,
        &cookie,
        &format!("/subscriptions/{id}/cancel"),
        "reason=quiet",
    );
    assert_eq!(none.header("location"), Some("/ops/outbox/subscriptions"));
    assert!(flash_after(&admin, &cookie, &none).contains("Nothing was cancelled"));

    let mut reasons = cancel_reasons(db);
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "mail provider replaced",
            "retired event",
            "retired event",
            "sent by mistake"
        ]
    );
    assert!(dead(&pool).is_empty(), "a cancel never dead-letters");
}

/// The delivery log on the pages and the API: a message's page lists its exchanges (also once
/// it has left the outbox), the deliveries page filters by destination and failures and pages
/// by id, and a receiver's answer, which anyone running an endpoint can write, is escaped.
fn operators_read_the_delivery_log_from_the_pages_and_the_api<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let admin = pages::<C>(&pool);
    let cookie = sign_in::<C>(&admin);
    let ids: Vec<MessageId> = (0..3)
        .map(|n| Mail { n }.enqueue(&mut pool.get().unwrap()).unwrap())
        .collect();
    let exchange = |destination: &str, outcome: &'static str, status: u16, answer: &str| Exchange {
        destination: destination.to_owned(),
        outcome,
        answer: Some(Answer::new(Some(status), answer)),
        error: (outcome != "delivered").then(|| format!("answered {status}")),
        started_at: std::time::SystemTime::now(),
        latency: Duration::from_millis(3),
    };
    // Message 0 fails at the CRM with a hostile answer and stays pending; 1 and 2 are
    // delivered to the mailer and leave the outbox.
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store.claim(token, ClaimLimit::messages(10), LEASE).unwrap();
    assert_eq!(claimed.len(), 3);
    let outcomes: Vec<_> = claimed
        .iter()
        .map(|m| {
            if m.message_id == ids[0] {
                let retry = Settlement::Retry {
                    delay: Duration::from_secs(3600),
                    error: "answered 500".into(),
                };
                let hostile = exchange("crm", "failed", 500, "<script>alert(1)</script>");
                outcome(token, m, retry).logging(m, vec![hostile])
            } else {
                outcome(token, m, Settlement::Done)
                    .logging(m, vec![exchange("mailer", "delivered", 202, "queued")])
            }
        })
        .collect();
    assert!(store.settle(&outcomes).unwrap().is_empty());

    let failing = get::<C>(&admin, &cookie, &format!("/messages/{}", ids[0]));
    let page = failing.text();
    assert_eq!(failing.status, 200, "{page}");
    assert!(page.contains("Delivery log"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;") || page.contains("answered 500")
    );
    assert!(
        !page.contains("<script>alert(1)"),
        "a receiver's answer is escaped"
    );

    // A delivered message is no longer in the outbox, and its page still shows its log.
    let delivered = get::<C>(&admin, &cookie, &format!("/messages/{}", ids[1]));
    assert_eq!(delivered.status, 200, "{}", delivered.text());
    assert!(delivered.text().contains("queued"), "{}", delivered.text());
    let api = json(&get::<C>(
        &admin,
        &cookie,
        &format!("/api/messages/{}", ids[1]),
    ));
    assert_eq!(api["state"], "not_in_outbox");
    assert_eq!(api["attempts"][0]["status"], 202);
    let unknown = get::<C>(&admin, &cookie, &format!("/messages/{}", MessageId::new()));
    assert_eq!(unknown.status, 404);

    let listed = get::<C>(&admin, &cookie, "/deliveries?destination=mailer");
    assert_eq!(listed.status, 200);
    assert_eq!(listed.text().matches("class=\"attempt\"").count(), 2);
    let failures = json(&get::<C>(&admin, &cookie, "/api/attempts?failures=1"));
    let failed = failures["attempts"].as_array().unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["message_id"], ids[0].to_string());
    assert_eq!(
        failed[0]["answer"], "<script>alert(1)</script>",
        "JSON keeps it as it was"
    );
    let all = json(&get::<C>(&admin, &cookie, "/api/attempts"));
    let newest = all["attempts"][0]["id"].as_i64().unwrap();
    let older = json(&get::<C>(
        &admin,
        &cookie,
        &format!("/api/attempts?before={newest}"),
    ));
    assert_eq!(older["attempts"].as_array().unwrap().len(), 2);
    let bad = get::<C>(&admin, &cookie, "/api/attempts?before=soon");
    assert_eq!(bad.status, 400);
    // By time: the last hour has all three; a window ending an hour ago has none.
    let recent = json(&get::<C>(&admin, &cookie, "/api/attempts?since=1h"));
    assert_eq!(recent["attempts"].as_array().unwrap().len(), 3);
    let earlier = json(&get::<C>(&admin, &cookie, "/api/attempts?until=1h"));
    assert_eq!(earlier["attempts"], serde_json::json!([]));
    let page = get::<C>(&admin, &cookie, "/deliveries?since=1h&failures=1").text();
    assert_eq!(page.matches("class=\"attempt\"").count(), 1, "{page}");
    let unreadable = get::<C>(&admin, &cookie, "/api/attempts?since=tomorrow");
    assert_eq!(unreadable.status, 400);
    // The destinations' names link to their deliveries.
    let overview = get::<C>(&admin, &cookie, "/deliveries");
    assert!(overview.text().contains("/deliveries?destination=crm"));
}

/// Replay and resend from the pages and the API: the Deliveries page of a destination offers
/// a replay of a range, a message's page a resend to each destination in its log; each posts,
/// says what it did, and enqueues deliveries with the original ids; bad input is refused with
/// the reason and enqueues nothing; and cross-site posts are refused as for every action.
fn operators_replay_and_resend_from_the_pages_and_the_api<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let admin = pages::<C>(&pool);
    let cookie = sign_in::<C>(&admin);
    // A worker reported the `mailer` destination; three mails were delivered and archived.
    DieselStore::new(pool.clone())
        .sync_destinations(&[SyncedDestination::new("mailer", "webhook")], &mut |_| {
            Vec::new()
        })
        .unwrap();
    let ids: Vec<MessageId> = (0..3)
        .map(|n| Mail { n }.enqueue(&mut pool.get().unwrap()).unwrap())
        .collect();
    let store = DieselStore::new(pool.clone()).archive(Duration::from_secs(3600));
    let token = ClaimToken::new();
    let claimed = store.claim(token, ClaimLimit::messages(10), LEASE).unwrap();
    let delivered = || Exchange {
        destination: "mailer".to_owned(),
        outcome: "delivered",
        answer: Some(Answer::new(Some(200), "ok")),
        error: None,
        started_at: std::time::SystemTime::now(),
        latency: Duration::from_millis(2),
    };
    let outcomes: Vec<_> = claimed
        .iter()
        .map(|m| outcome(token, m, Settlement::Done).logging(m, vec![delivered()]))
        .collect();
    assert!(store.settle(&outcomes).unwrap().is_empty());
    assert!(pending(&pool).is_empty());

    let page = get::<C>(&admin, &cookie, "/deliveries?destination=mailer").text();
    assert!(page.contains("id=\"replay\""), "{page}");
    let replayed = post::<C>(
        &admin,
        &cookie,
        "/deliveries/replay",
        "destination=mailer&since=1h&type=admin.mail",
    );
    assert_eq!(replayed.status, 303, "{}", replayed.text());
    assert_eq!(
        replayed.header("location"),
        Some("/ops/outbox/deliveries?destination=mailer")
    );
    let waiting: Vec<MessageId> = pending(&pool).iter().map(|m| m.message_id).collect();
    assert_eq!(
        waiting, ids,
        "the three mails again, with their ids, in order"
    );

    let message = get::<C>(&admin, &cookie, &format!("/messages/{}", ids[1])).text();
    assert!(message.contains("Resend to mailer"), "{message}");
    let resent = post::<C>(
        &admin,
        &cookie,
        &format!("/messages/{}/resend", ids[1]),
        "destination=mailer",
    );
    assert_eq!(resent.status, 303, "{}", resent.text());
    assert_eq!(pending(&pool).len(), 4);
    let api = json(&post::<C>(
        &admin,
        &cookie,
        "/api/resend",
        &format!("message_id={}&destination=mailer", ids[2]),
    ));
    assert_eq!(api["enqueued"], 1);
    assert_eq!(pending(&pool).len(), 5);

    for (path, form, says) in [
        ("/deliveries/replay", "destination=mailer", "give `since`"),
        (
            "/deliveries/replay",
            "destination=nowhere&since=1h",
            "nowhere",
        ),
        (
            "/deliveries/replay",
            "destination=mailer&since=soon",
            "neither an RFC 3339",
        ),
        (
            "/deliveries/replay",
            "since=1h",
            "either a destination or a subscription",
        ),
        (
            "/api/resend",
            "message_id=x&destination=mailer",
            "not a message id",
        ),
    ] {
        let refused = post::<C>(&admin, &cookie, path, form);
        assert_eq!(refused.status, 400, "{path} {form}: {}", refused.text());
        assert!(
            refused.text().contains(says),
            "{path} {form}: {}",
            refused.text()
        );
    }
    let cross_site = admin.handle(
        &Request::new("POST", "/deliveries/replay")
            .header("cookie", &cookie)
            .header("sec-fetch-site", "cross-site")
            .body("destination=mailer&since=1h".to_owned()),
    );
    assert_eq!(cross_site.status, 403);
    assert_eq!(pending(&pool).len(), 5, "nothing refused was enqueued");
}

backend_tests!(
    operators_replay_and_resend_from_the_pages_and_the_api,
    operators_read_the_delivery_log_from_the_pages_and_the_api,
    operators_cancel_waiting_messages_from_the_pages_and_the_api,
    operators_manage_subscriptions_from_the_pages,
    operators_pause_and_resume_types_and_destinations_from_the_pages,
    signing_out_ends_the_session_on_every_replica,
    listings_read_payload_previews_and_a_message_its_whole_payload,
    listings_filter_and_page_by_position_covering_every_message_once,
    the_pages_need_the_token_and_refuse_cross_site_posts,
    bulk_actions_do_only_the_count_the_operator_confirmed,
    a_message_page_shows_what_it_carries_and_escapes_what_it_says,
    the_overview_shows_backlog_types_and_blocked_keys,
);
