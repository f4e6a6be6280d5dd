//! A worker process for tests that kill it: runs until killed, delivering `test.hook` messages
//! to a webhook.
//!
//! Configured by environment: `OUTBOX_WORKER_DATABASE_URL` (a postgres:// or mysql:// URL, or
//! an SQLite file path), `OUTBOX_WORKER_WEBHOOK_URL` (on 127.0.0.1), and optionally
//! `OUTBOX_WORKER_LEASE_MS`, `OUTBOX_WORKER_THREADS`, `OUTBOX_WORKER_BATCH`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use diesel::r2d2::{ConnectionManager, Pool};
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{DieselStore, OutboxConnection, PoolCustomizer, Worker};
use outbox_tests::worker_support::{secret, TestConnection};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run<C: TestConnection + OutboxConnection>(url: &str) {
    let pool = Pool::builder()
        .max_size(4)
        .connection_customizer(Box::new(PoolCustomizer))
        .build(ConnectionManager::<C>::new(url))
        .expect("a pool");
    let endpoint = WebhookEndpoint::builder(env("OUTBOX_WORKER_WEBHOOK_URL"))
        .secret(secret())
        .timeout(Duration::from_secs(1))
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .build()
        .expect("an endpoint");
    let _worker = Worker::builder(DieselStore::new(pool))
        .handler_threads(number("OUTBOX_WORKER_THREADS", 8) as usize)
        .batch_size(number("OUTBOX_WORKER_BATCH", 16) as usize)
        .poll_interval(Duration::from_millis(100))
        .webhook(endpoint)
        .handler_timeout(Duration::from_secs(1))
        .lease(Duration::from_millis(number(
            "OUTBOX_WORKER_LEASE_MS",
            6000,
        )))
        .spawn()
        .expect("the worker starts");
    println!("ready");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn main() {
    let url = env("OUTBOX_WORKER_DATABASE_URL");
    if url.starts_with("postgres") {
        run::<diesel::PgConnection>(&url);
    } else if url.starts_with("mysql") {
        run::<diesel::MysqlConnection>(&url);
    } else {
        run::<diesel::SqliteConnection>(&url);
    }
}
