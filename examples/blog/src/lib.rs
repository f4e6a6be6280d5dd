//! The outbox example: a blog that thanks first-time commenters.
//!
//! A comment, the commenter's subscription to the post, a notification for every other
//! subscriber and, on a first comment ever, a thank-you are written in one transaction. The
//! outbox worker, started when Rocket lifts off, delivers the messages to a webhook standing in
//! for a mail service: by default the blog's own `/receiver/hooks`, which verifies the signature
//! and records each delivery once through the outbox's inbox. `/outbox` shows the queue and the
//! dead letters to operators, `/metrics` the worker's metrics in Prometheus' text format.
//!
//! Readers subscribe webhooks of their own to a post's events at `/posts/<id>/webhooks`: each
//! comment enqueues a `comment.posted` event in the same transaction, and every subscription
//! of the post that asks for it gets its own delivery, retried on its own. Their endpoints stand
//! in at `/receiver/readers/<hook>`, where the deliveries can be watched arriving.
//!
//! Configuration (environment):
//! - `DATABASE_URL`: an SQLite file (default `blog.db`), or `postgres://…` / `mysql://…` when
//!   built with the `postgres` / `mysql` feature.
//! - `ROCKET_ADDRESS`, `ROCKET_PORT`: where to listen (default 127.0.0.1:8000).
//! - `WEBHOOK_URL`, `WEBHOOK_SECRET`: where to deliver and the `whsec_…` signing secret
//!   (default: the built-in receiver, with a secret made at start).
//! - `OUTBOX_ADMIN_TOKEN`: the token for `/outbox` (default: made at start and printed once).
//! - `OUTBOX_SECRET_KEYS`: `ID:BASE64` keys that encrypt subscriptions' secrets at rest, the
//!   first one encrypting (default: none, secrets stored as they are).
//! - `BLOG_MAX_ATTEMPTS`, `BLOG_RETRY_MS`: a shorter retry schedule, to watch dead letters
//!   happen (default: the library's, 10 attempts over about 15 hours).

#![forbid(unsafe_code)]

pub mod comments;
pub mod db;
pub mod messages;
pub mod metrics;
pub mod pages;
mod routes;

pub use routes::LOGGED_DELIVERIES;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::r2d2::Pool;
use outbox_diesel::inbox::Inbox;
use outbox_diesel::subscription::Subscriptions;
use outbox_diesel::webhook::{WebhookEndpoint, WebhookSecret};
use outbox_diesel::{DieselStore, OutboxManager, RetryPolicy, Worker, WorkerHandle};
use rocket::fairing::AdHoc;
use rocket::{Build, Rocket};

use crate::db::DbPool;

/// Connections the web handlers may use at once, besides the worker's.
const WEB_CONNECTIONS: u32 = 8;
/// Connections the worker holds: its claimer's, its acker's, its housekeeper's and, on
/// PostgreSQL, its `LISTEN` connection.
const WORKER_CONNECTIONS: u32 = 4;

/// How long delivered messages stay in the archive, replayable.
const ARCHIVE_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How the blog is set up; see the crate documentation for the environment variables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The database.
    pub database_url: String,
    /// The port to listen on (127.0.0.1 unless `ROCKET_ADDRESS` says otherwise).
    pub port: u16,
    /// Where messages are delivered; `None` for the built-in receiver.
    pub webhook_url: Option<String>,
    /// The signing secret, shared with the built-in receiver.
    pub webhook_secret: WebhookSecret,
    /// The admin page's token.
    pub admin_token: String,
    /// The worker's retry policy.
    pub retry_policy: RetryPolicy,
    /// The keys that encrypt subscriptions' secrets (`ID:BASE64,...`), if any.
    pub secret_keys: Option<String>,
}

fn random_token() -> String {
    let whsec = WebhookSecret::generate().expose_whsec();
    whsec
        .trim_start_matches("whsec_")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

/// A short random name for a reader's hook.
pub(crate) fn hook_tag() -> String {
    random_token().chars().take(10).collect()
}

impl Settings {
    /// Reads the environment, making a secret and an admin token where none is given.
    pub fn from_env() -> Result<Settings, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let webhook_secret = match var("WEBHOOK_SECRET") {
            Some(text) => {
                WebhookSecret::parse(&text).map_err(|e| format!("WEBHOOK_SECRET: {e}"))?
            }
            None => WebhookSecret::generate(),
        };
        let admin_token = match var("OUTBOX_ADMIN_TOKEN") {
            Some(token) => token,
            None => {
                let token = random_token();
                println!("\n  Outbox admin token (for /outbox; set OUTBOX_ADMIN_TOKEN to choose one): {token}\n");
                token
            }
        };
        let mut retry_policy = RetryPolicy::new();
        if let Some(attempts) = var("BLOG_MAX_ATTEMPTS") {
            let attempts = attempts
                .parse()
                .map_err(|_| "BLOG_MAX_ATTEMPTS must be a whole number".to_owned())?;
            retry_policy = retry_policy.max_attempts(attempts);
        }
        if let Some(ms) = var("BLOG_RETRY_MS") {
            let ms = ms
                .parse()
                .map_err(|_| "BLOG_RETRY_MS must be a number of milliseconds".to_owned())?;
            retry_policy = retry_policy
                .initial_backoff(Duration::from_millis(ms))
                .multiplier(2.0);
        }
        let port = match var("ROCKET_PORT") {
            Some(port) => port
                .parse()
                .map_err(|_| "ROCKET_PORT must be a port number".to_owned())?,
            None => 8000,
        };
        Ok(Settings {
            database_url: var("DATABASE_URL").unwrap_or_else(|| "blog.db".to_owned()),
            port,
            webhook_url: var("WEBHOOK_URL"),
            webhook_secret,
            admin_token,
            retry_policy,
            secret_keys: var("OUTBOX_SECRET_KEYS"),
        })
    }
}

/// The loopback addresses the webhook endpoint may dial: those of the configured receiver's
/// host when it is this machine (the built-in receiver is 127.0.0.1), none otherwise.
/// Endpoints refuse loopback addresses unless allowed, so a receiver whose name later resolves
/// to 127.0.0.1 still cannot reach this machine's own services.
pub fn receiver_addresses(host: Option<&str>) -> Vec<IpAddr> {
    let Some(host) = host else {
        return Vec::new();
    };
    if host.eq_ignore_ascii_case("localhost") {
        return vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ];
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    match literal.parse::<IpAddr>() {
        Ok(address) if address.is_loopback() => vec![address],
        _ => Vec::new(),
    }
}

/// What the routes share.
#[allow(missing_debug_implementations)] // holds the admin token
pub struct App {
    pub(crate) db: DbPool,
    pub(crate) inbox: Inbox,
    pub(crate) receiver_failing: AtomicBool,
    /// The operator pages (`outbox-admin`), mounted at `/outbox`; their sign-in also opens
    /// the blog's `/receiver` page.
    pub(crate) admin: Arc<OutboxAdmin>,
    pub(crate) metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// What subscriptions may be and how they are delivered: readers' hooks are the blog's own
    /// `/receiver/readers/...` on 127.0.0.1.
    pub(crate) subscriptions: Subscriptions,
    /// The signing secret readers' hooks are given, so that their stand-in endpoints can check
    /// what arrives (an application's customers would each get their own, shown once).
    pub(crate) webhook_secret: outbox_diesel::webhook::WebhookSecret,
    /// The blog's own address, for the readers' stand-in endpoints.
    pub(crate) base_url: String,
    worker: Arc<Mutex<Option<WorkerHandle>>>,
}

/// The operator pages over the blog's pool.
pub(crate) type OutboxAdmin = outbox_admin::Admin<OutboxManager<db::AnyConnection>>;

/// The blog, ready to launch.
pub fn rocket(settings: Settings) -> Result<Rocket<Build>, String> {
    let port = settings.port;
    let figment = rocket::Config::figment().merge(("port", port));
    let webhook_url = settings
        .webhook_url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{port}/receiver/hooks"));
    let build = |allowed: &[IpAddr]| {
        allowed
            .iter()
            .fold(
                WebhookEndpoint::builder(webhook_url.clone())
                    .secret(settings.webhook_secret.clone())
                    .timeout(Duration::from_secs(5)),
                |builder, address| builder.allow_address(*address),
            )
            .build()
            .map_err(|e| format!("the webhook endpoint: {e}"))
    };
    let host = build(&[])?.url().host_str().map(str::to_owned);
    let endpoint = build(&receiver_addresses(host.as_deref()))?;
    let mut subscriptions = Subscriptions::new()
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .timeout(Duration::from_secs(5));
    if let Some(keys) = &settings.secret_keys {
        subscriptions = subscriptions
            .secret_keys(keys)
            .map_err(|e| format!("OUTBOX_SECRET_KEYS: {e}"))?;
    }

    // The manager's errors show the URL without its password.
    let manager = OutboxManager::new(&settings.database_url).map_err(|e| e.to_string())?;
    let db: DbPool = Pool::builder()
        .max_size(WEB_CONNECTIONS + WORKER_CONNECTIONS)
        .build(manager)
        .map_err(|e| format!("cannot open the database: {e}"))?;
    let mut conn = db
        .get()
        .map_err(|e| format!("cannot open the database: {e}"))?;
    db::migrate(&mut conn).map_err(|e| format!("migrations failed: {e}"))?;
    drop(conn);

    let worker_pool = db.clone();
    let worker: Arc<Mutex<Option<WorkerHandle>>> = Arc::default();
    let worker_stats = Arc::clone(&worker);
    let admin = outbox_admin::Admin::builder(db.clone(), settings.admin_token.clone())
        .base_path("/outbox")
        .cookie_path("/")
        .worker_stats(move || {
            worker_stats
                .lock()
                .ok()
                .and_then(|slot| slot.as_ref().map(WorkerHandle::stats))
                .unwrap_or_default()
        })
        .subscriptions(subscriptions.clone())
        .build()
        .map_err(|e| format!("the admin pages (OUTBOX_ADMIN_TOKEN): {e}"))?;
    let admin = Arc::new(admin);
    let app = App {
        db,
        inbox: Inbox::new([settings.webhook_secret.clone()]),
        receiver_failing: AtomicBool::new(false),
        admin: Arc::clone(&admin),
        metrics: metrics::recorder(),
        subscriptions: subscriptions.clone(),
        webhook_secret: settings.webhook_secret.clone(),
        base_url: format!("http://127.0.0.1:{port}"),
        worker,
    };
    let delivery = subscriptions.delivery();
    let retry_policy = settings.retry_policy.clone();
    let rocket = rocket::custom(figment)
        .manage(app)
        .mount("/", routes::all());
    Ok(outbox_admin::rocket::mount(rocket, admin)
        .attach(AdHoc::on_liftoff("outbox worker", move |rocket| {
            Box::pin(async move {
                let Some(app) = rocket.state::<App>() else {
                    return;
                };
                let spawned = rocket::tokio::task::spawn_blocking(move || {
                    // Delivered messages are archived for a week: an operator can replay
                    // a range of them to a receiver that lost them (the Deliveries page).
                    let store = DieselStore::new(worker_pool).archive(ARCHIVE_WINDOW);
                    Worker::builder(store)
                        .handler_threads(4)
                        .retry_policy(retry_policy)
                        .destination(messages::MAIL, endpoint)
                        .subscriptions(delivery)
                        .spawn()
                })
                .await;
                match spawned {
                    Ok(Ok(worker)) => {
                        if let Ok(mut slot) = app.worker.lock() {
                            *slot = Some(worker);
                        }
                    }
                    Ok(Err(error)) => {
                        log::error!("the outbox worker did not start: {error}");
                        rocket.shutdown().notify();
                    }
                    Err(error) => log::error!("the outbox worker did not start: {error}"),
                }
            })
        }))
        .attach(AdHoc::on_shutdown("outbox worker", |rocket| {
            Box::pin(async move {
                let worker = rocket
                    .state::<App>()
                    .and_then(|app| app.worker.lock().ok()?.take());
                if let Some(worker) = worker {
                    let stopped = rocket::tokio::task::spawn_blocking(move || {
                        worker.shutdown(Duration::from_secs(10))
                    })
                    .await;
                    if let Ok(Err(error)) = stopped {
                        log::warn!("outbox worker shutdown: {error}");
                    }
                }
            })
        })))
}
