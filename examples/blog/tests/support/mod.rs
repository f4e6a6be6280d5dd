//! Starting the blog for a test: a fresh SQLite file, a free port, known secrets.

#![allow(dead_code)]

use std::net::TcpListener;
use std::time::Duration;

use outbox_diesel::webhook::WebhookSecret;
use outbox_diesel::RetryPolicy;
use outbox_example_blog::db::{self, Delivery};
use outbox_example_blog::Settings;

pub use outbox_testkit::outbox::SECRET;
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A temporary database file, removed on drop.
#[derive(Debug)]
pub struct TempDb(pub String);

impl TempDb {
    pub fn new(name: &str) -> TempDb {
        TempDb(outbox_testkit::db::temp_sqlite_path(&format!(
            "blog-{name}"
        )))
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = outbox_testkit::db::remove_sqlite_files(&self.0);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn settings(db: &TempDb, port: u16) -> Settings {
    Settings {
        database_url: db.0.clone(),
        port,
        webhook_url: None,
        webhook_secret: WebhookSecret::parse(SECRET).unwrap(),
        admin_token: ADMIN_TOKEN.into(),
        retry_policy: RetryPolicy::new()
            .max_attempts(2)
            .initial_backoff(Duration::from_millis(200))
            .multiplier(1.0),
        secret_keys: Some(format!("test:{}", "A".repeat(43) + "=")),
    }
}

/// The blog serving on a real port, with its worker; stops on drop.
#[derive(Debug)]
pub struct Server {
    pub base: String,
    pub db: TempDb,
    shutdown: rocket::Shutdown,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(name: &str) -> Server {
        let db = TempDb::new(name);
        let port = free_port();
        let rocket = outbox_example_blog::rocket(settings(&db, port)).expect("the blog builds");
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            rocket::execute(async move {
                let rocket = rocket.ignite().await.expect("the blog ignites");
                tx.send(rocket.shutdown())
                    .expect("handing over the shutdown handle");
                let _ = rocket.launch().await;
            })
        });
        let shutdown = rx.recv().expect("the blog started");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::blocking::Client::new();
        assert!(
            outbox_testkit::eventually(Duration::from_secs(20), || client
                .get(format!("{base}/posts/1"))
                .send()
                .is_ok()),
            "the blog did not come up"
        );
        Server {
            base,
            db,
            shutdown,
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        let mut conn: db::AnyConnection =
            outbox_diesel::establish(&self.db.0).expect("opening the blog's db");
        let mut all = db::recent_deliveries(&mut conn, 10_000).expect("reading deliveries");
        all.reverse();
        all
    }

    /// Waits until `done(deliveries)` holds.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Delivery]) -> bool) -> Vec<Delivery> {
        let mut deliveries = Vec::new();
        let held = outbox_testkit::eventually(Duration::from_secs(30), || {
            deliveries = self.deliveries();
            done(&deliveries)
        });
        assert!(held, "timed out waiting for {what}: {deliveries:#?}");
        deliveries
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.clone().notify();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Deliveries of `message_type` whose body mentions `needle`, verified and new.
pub fn delivered(deliveries: &[Delivery], message_type: &str, needle: &str) -> usize {
    deliveries
        .iter()
        .filter(|d| {
            d.message_type == message_type
                && d.outcome == "verified, delivered"
                && d.body.contains(needle)
        })
        .count()
}
