//! The outbox's operator pages, for any web application to mount under its own path: what is
//! waiting and for how long, what is stuck and why, one message by id, and the dead letters
//! with re-queue and purge.
//!
//! The pages are plain request → response functions ([`Admin::handle`]), so any framework can
//! serve them: hand over the method, the path below the mount point, the headers and the body,
//! and send back the [`Response`]. With the `rocket` feature,
//! [`rocket::mount`] does that for a Rocket 0.5 application.
//!
//! - **HTML**: an overview (pending, in flight, dead, the oldest due message's wait, settled
//!   per second, each with a small chart of the last minutes; counts by type; ordering keys
//!   blocked behind a failing head), the pending messages with filters (type, ordering key,
//!   attempts, due now) and keyset pagination, one message (payload pretty-printed, attempts,
//!   last error, next attempt, headers), the dead letters with re-queue and purge, one by one
//!   or in bulk behind a confirmation that states the count, the subscriptions, and a cancel
//!   of waiting messages (one message, a type, a subscription's deliveries) with the
//!   operator's reason.
//! - **JSON** (the same figures, and a cancel): see [`Admin::handle`] for the endpoints.
//!
//! **Security.** Everything needs the admin token: once through the sign-in form, which sets
//! an `HttpOnly`, `SameSite=Strict` session cookie, or as `Authorization: Bearer <token>` on
//! the JSON endpoints. Cookies are signed with [`AdminBuilder::session_key`] (give every
//! replica the same one) or, without it, a key made at start-up (sessions then end when the
//! process does). A session is bound to the token it signed in with: changing the token ends
//! every session on every replica, whatever the key (after a leak, change the token; the key
//! may stay). Signing out ends the session everywhere: its id is kept in the database
//! (`outbox_admin_revoked`) until the cookie would have expired, and a copy of the cookie is
//! refused. Every `POST` a browser sends on behalf of another site is refused (by
//! `Sec-Fetch-Site`, or `Origin` against `Host`). Pages carry a strict Content Security
//! Policy and are never cached. Webhook secrets are never shown (they are not in the
//! database); every action, and every failed sign-in, is logged with the `outbox_admin`
//! target.
//!
//! ```
//! use diesel::r2d2::Pool;
//! use diesel::SqliteConnection;
//! use outbox_admin::{Admin, Request};
//! use outbox_diesel::OutboxManager;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let file = std::env::temp_dir().join(format!("outbox-admin-doc-{}.db", std::process::id()));
//! # let url = file.to_string_lossy().into_owned();
//! let pool = Pool::builder().build(OutboxManager::<SqliteConnection>::new(&url)?)?;
//! outbox_diesel::run_migrations(&mut *pool.get()?)?;
//!
//! let admin = Admin::builder(pool, "a-long-random-admin-token")
//!     .base_path("/outbox")
//!     .build()?;
//!
//! // A script reads the figures with the token...
//! let response = admin.handle(
//!     &Request::new("GET", "/api/overview")
//!         .header("authorization", "Bearer a-long-random-admin-token"),
//! );
//! assert_eq!(response.status, 200);
//! let overview: serde_json::Value = serde_json::from_slice(&response.body)?;
//! assert_eq!(overview["pending"], 0);
//!
//! // ...and without it gets nothing.
//! assert_eq!(admin.handle(&Request::new("GET", "/api/overview")).status, 401);
//! # std::fs::remove_file(&file).ok();
//! # Ok(())
//! # }
//! ```

mod chart;
mod http;
mod pages;
#[cfg(feature = "rocket")]
pub mod rocket;
mod routes;
mod session;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::r2d2::{ManageConnection, Pool};
use outbox_diesel::{OutboxConnection, WorkerStats};

pub use http::{Request, Response};
pub use session::MIN_SESSION_KEY_BYTES;

use chart::Samples;
use session::Sessions;

/// The shortest admin token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// Why an [`Admin`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The token is too short to keep anyone out.
    #[error(
        "the admin token has {length} characters; use at least {MIN_TOKEN_LENGTH} random ones"
    )]
    TokenTooShort {
        /// Its length.
        length: usize,
    },
    /// The base path is not an absolute path without a trailing slash.
    #[error("the base path `{0}` must start with `/` and must not end with one (`/outbox`)")]
    BasePath(String),
    /// The operating system gave no randomness for the session key.
    #[error("no randomness for the session key: {0}")]
    Random(String),
    /// The configured session key is too short to resist guessing.
    #[error(
        "the admin session key has {length} bytes; use at least {MIN_SESSION_KEY_BYTES} random \
         ones (e.g. `openssl rand -base64 48`, kept with the application's other secrets)"
    )]
    SessionKeyTooShort {
        /// Its length in bytes.
        length: usize,
    },
}

/// How [`Admin`] learns what a worker in this process has settled, for the throughput figure.
type StatsSource = Arc<dyn Fn() -> WorkerStats + Send + Sync>;

/// The operator pages over one pool: see the [crate docs](crate).
pub struct Admin<M: ManageConnection> {
    pool: Pool<M>,
    base_path: String,
    sessions: Sessions,
    worker_stats: Option<StatsSource>,
    samples: Mutex<Samples>,
    refresh: Duration,
    subscriptions: Option<outbox_diesel::subscription::Subscriptions>,
}

impl<M: ManageConnection> fmt::Debug for Admin<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("base_path", &self.base_path)
            .field("worker_stats", &self.worker_stats.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds an [`Admin`]: [`Admin::builder`].
pub struct AdminBuilder<M: ManageConnection> {
    pool: Pool<M>,
    token: String,
    base_path: String,
    cookie_path: Option<String>,
    secure_cookie: bool,
    session_lifetime: Duration,
    session_key: Option<Vec<u8>>,
    worker_stats: Option<StatsSource>,
    refresh: Duration,
    subscriptions: Option<outbox_diesel::subscription::Subscriptions>,
}

impl<M: ManageConnection> fmt::Debug for AdminBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminBuilder")
            .field("base_path", &self.base_path)
            .field("secure_cookie", &self.secure_cookie)
            .finish_non_exhaustive()
    }
}

impl<M> AdminBuilder<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    /// Where the pages are mounted (default `/outbox`): their links and forms point below it.
    pub fn base_path(mut self, path: impl Into<String>) -> Self {
        self.base_path = path.into();
        self
    }

    /// The path the session cookie is sent to (default: the base path). Widen it (`/`) when the
    /// application checks [`Admin::is_signed_in`] for pages of its own elsewhere.
    pub fn cookie_path(mut self, path: impl Into<String>) -> Self {
        self.cookie_path = Some(path.into());
        self
    }

    /// Marks the session cookie `Secure` (sent over HTTPS only): set it whenever the pages are
    /// served over HTTPS. Off by default, so that a loopback `http://` page works.
    pub fn secure_cookie(mut self, secure: bool) -> Self {
        self.secure_cookie = secure;
        self
    }

    /// How long a sign-in lasts (default 12 hours).
    pub fn session_lifetime(mut self, lifetime: Duration) -> Self {
        self.session_lifetime = lifetime;
        self
    }

    /// The key session cookies are signed with (at least [`MIN_SESSION_KEY_BYTES`] bytes),
    /// from the application's configuration: give every replica behind one address the same
    /// key, or a sign-in on one is unknown to the next. Without it a key is drawn at start-up,
    /// and a restart signs everyone out. A new admin token signs everyone out too, with the
    /// same key: sessions are bound to the token they signed in with.
    pub fn session_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.session_key = Some(key.as_ref().to_vec());
        self
    }

    /// What the pages create and rotate subscriptions' secrets with (the keys that encrypt
    /// them, the addresses this application trusts): the same
    /// [`Subscriptions`](outbox_diesel::subscription::Subscriptions) the application uses.
    /// Without it the subscriptions page lists, enables, disables and removes, but adds none
    /// and rotates no secret.
    pub fn subscriptions(
        mut self,
        subscriptions: outbox_diesel::subscription::Subscriptions,
    ) -> Self {
        self.subscriptions = Some(subscriptions);
        self
    }

    /// How often the overview reloads itself (default 10 s; zero: never).
    pub fn refresh_every(mut self, interval: Duration) -> Self {
        self.refresh = interval;
        self
    }

    /// The stats of a worker running in this process, for the "settled per second" figure
    /// (without it the overview shows the backlog only: the database keeps no count of what
    /// was delivered).
    ///
    /// ```no_run
    /// # fn wire(
    /// #     builder: outbox_admin::AdminBuilder<outbox_diesel::OutboxManager<diesel::SqliteConnection>>,
    /// #     worker: std::sync::Arc<outbox_diesel::WorkerHandle>,
    /// # ) {
    /// let builder = builder.worker_stats(move || worker.stats());
    /// # }
    /// ```
    pub fn worker_stats(mut self, stats: impl Fn() -> WorkerStats + Send + Sync + 'static) -> Self {
        self.worker_stats = Some(Arc::new(stats));
        self
    }

    /// The pages, ready to serve.
    pub fn build(self) -> Result<Admin<M>, AdminError> {
        let token = self.token.trim();
        if token.chars().count() < MIN_TOKEN_LENGTH {
            return Err(AdminError::TokenTooShort {
                length: token.chars().count(),
            });
        }
        let valid_path = |path: &str| {
            path.starts_with('/')
                && !path.ends_with('/')
                && !path.contains(|c: char| c.is_control() || c == ';' || c == ',' || c == '"')
        };
        if !valid_path(&self.base_path) {
            return Err(AdminError::BasePath(self.base_path));
        }
        let cookie_path = self.cookie_path.unwrap_or_else(|| self.base_path.clone());
        if cookie_path != "/" && !valid_path(&cookie_path) {
            return Err(AdminError::BasePath(cookie_path));
        }
        let sessions = Sessions::new(
            token,
            self.session_key.as_deref(),
            cookie_path,
            self.secure_cookie,
            self.session_lifetime,
        )?;
        Ok(Admin {
            pool: self.pool,
            base_path: self.base_path,
            sessions,
            worker_stats: self.worker_stats,
            samples: Mutex::new(Samples::default()),
            refresh: self.refresh,
            subscriptions: self.subscriptions,
        })
    }
}

impl<M: ManageConnection> Admin<M> {
    /// Where the pages are mounted.
    pub fn base_path(&self) -> &str {
        &self.base_path
    }
}

impl<M> Admin<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    /// Pages over `pool`, for operators who present `token` (at least
    /// [`MIN_TOKEN_LENGTH`] characters).
    pub fn builder(pool: Pool<M>, token: impl Into<String>) -> AdminBuilder<M> {
        AdminBuilder {
            pool,
            token: token.into(),
            base_path: "/outbox".to_owned(),
            cookie_path: None,
            secure_cookie: false,
            session_lifetime: Duration::from_secs(12 * 3600),
            session_key: None,
            worker_stats: None,
            refresh: Duration::from_secs(10),
            subscriptions: None,
        }
    }

    /// Whether `request` carries a valid session cookie of a session that has not signed
    /// out: for an application's own operator pages (widen [`AdminBuilder::cookie_path`] for
    /// them to receive it). A request that is not signed in can be sent to
    /// `{base_path}/login?next=/your/page`. Reads the database (sign-outs are kept there); a
    /// database that does not answer counts as not signed in.
    pub fn is_signed_in(&self, request: &Request) -> bool {
        routes::signed_in(self, request).unwrap_or_else(|error| {
            log::error!(target: "outbox_admin", "could not check a session: {error}");
            false
        })
    }

    /// Answers one request; `request`'s path is below the mount point (`/`, `/dead`, ...).
    /// Blocks on the database: call it where blocking is allowed (a thread of a blocking pool
    /// in an async server).
    ///
    /// Pages: `GET /` (overview), `GET /messages` (pending; query `type`, `key`,
    /// `min_attempts`, `due=1`, `after`), `GET /messages/{message_id}`, `GET /dead` (query
    /// `type`, `key`, `after`), `GET /dead/confirm?action=requeue|purge&type=`,
    /// `POST /dead/requeue` and `POST /dead/purge` (form `type`, `count`: done only if the
    /// count still holds), `POST /dead/{position}/requeue|purge`,
    /// `POST /messages/{message_id}/cancel`, `POST /messages/cancel` (form `type`) and
    /// `POST /subscriptions/{id}/cancel` (each with form `reason`: see
    /// [`outbox_diesel::admin::cancel`]),
    /// `POST /destinations/{name}/enable`, `POST /types/{type}/pause|resume` and
    /// `POST /destinations/{name}/pause|resume` (an operator's pause: see
    /// [`outbox_diesel::admin::pause`]), `GET|POST /login`, `POST /logout`.
    ///
    /// JSON (`GET`, cookie or bearer token): `/api/overview` (`pending`, `in_flight`,
    /// `dead`, `oldest_due_age_seconds`, `settled_per_second` or null, `types`, `paused`,
    /// `samples`
    /// [{`at_unix_ms`, `pending`, `oldest_due_age_seconds`, `settled_per_second`}]),
    /// `/api/messages` (the pending page's query; `messages` and `next_after`, null on the
    /// last page), `/api/messages/{id}` (`state`: `pending` or `dead`, and the `message`),
    /// `/api/dead` (`dead_letters`, `next_after`), `/api/blocked` (`blocked_keys`),
    /// `/api/destinations` (`destinations`: as the workers report them), `/api/paused`
    /// (`paused`: what operators paused). `POST /api/cancel` (form `message_id`, `type`,
    /// `subscription`, `older_than_seconds`, `reason`) cancels and answers `cancelled` and
    /// `in_flight`, as `outbox cancel --json` prints them.
    ///
    /// The records (messages, dead letters, blocked keys, destinations, types) have one JSON
    /// form, the one `outbox … --json` prints (see
    /// [`outbox_diesel::admin`]): times in RFC 3339, payloads as JSON. A
    /// listing carries each payload's first [`PREVIEW_CHARS`](outbox_diesel::admin::PREVIEW_CHARS)
    /// characters (`payload_preview` when cut, `payload_truncated`); a message's own
    /// `/api/messages/{id}` carries it whole. Pages hold at most 50 records.
    pub fn handle(&self, request: &Request) -> Response {
        routes::handle(self, request)
    }
}
