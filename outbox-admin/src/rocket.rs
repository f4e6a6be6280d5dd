//! Serving the pages from a Rocket 0.5 application (feature `rocket`).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn build(
//! #     rocket: ::rocket::Rocket<::rocket::Build>,
//! #     pool: diesel::r2d2::Pool<outbox_diesel::OutboxManager<diesel::SqliteConnection>>,
//! # ) -> Result<::rocket::Rocket<::rocket::Build>, outbox_admin::AdminError> {
//! let admin = Arc::new(outbox_admin::Admin::builder(pool, "a-long-random-admin-token").build()?);
//! // Every page below /outbox; database work runs on Rocket's blocking pool.
//! Ok(outbox_admin::rocket::mount(rocket, admin))
//! # }
//! ```

use std::io::Cursor;
use std::sync::Arc;

use diesel::r2d2::ManageConnection;
use outbox_diesel::OutboxConnection;
use rocket::data::{Data, ToByteUnit};
use rocket::http::{Method, Status};
use rocket::route::{Handler, Outcome, Route};
use rocket::{Build, Rocket};

use crate::{Admin, Request};

/// The largest form the pages take (a sign-in or a confirmation is a few hundred bytes).
const MAX_FORM_BYTES: u64 = 16 * 1024;

/// Mounts `admin`'s pages at its base path.
pub fn mount<M>(rocket: Rocket<Build>, admin: Arc<Admin<M>>) -> Rocket<Build>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let base = admin.base_path().to_owned();
    rocket.mount(base, routes(admin))
}

/// The routes of `admin`'s pages, to mount at [`Admin::base_path`] yourself.
pub fn routes<M>(admin: Arc<Admin<M>>) -> Vec<Route>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let serve = Serve(admin);
    vec![
        Route::new(Method::Get, "/<path..>", serve.clone()),
        Route::new(Method::Post, "/<path..>", serve),
    ]
}

/// The framework-neutral request of a Rocket request (its body aside).
pub fn request_of(request: &rocket::Request<'_>, base_path: &str) -> Request {
    let path = request.uri().path().as_str();
    let below = path.strip_prefix(base_path).unwrap_or(path);
    let below = if below.is_empty() { "/" } else { below };
    let target = match request.uri().query() {
        Some(query) => format!("{below}?{}", query.as_str()),
        None => below.to_owned(),
    };
    let mut neutral = Request::new(request.method().as_str(), &target);
    for header in request.headers().iter() {
        neutral = neutral.header(header.name().as_str(), header.value());
    }
    // Rocket's local test client hands cookies over in the jar, without a header.
    if request.headers().get_one("cookie").is_none() {
        for cookie in request.cookies().iter() {
            neutral = neutral.header("cookie", &format!("{}={}", cookie.name(), cookie.value()));
        }
    }
    match request.client_ip() {
        Some(ip) => neutral.peer(ip),
        None => neutral,
    }
}

/// Whether a Rocket request carries `admin`'s session cookie of a session that has not signed
/// out: for the application's own operator pages (see
/// [`AdminBuilder::cookie_path`](crate::AdminBuilder::cookie_path)). The sign-outs are in the
/// database, so this reads it on a blocking thread.
pub async fn is_signed_in<M>(admin: &Arc<Admin<M>>, request: &rocket::Request<'_>) -> bool
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let neutral = request_of(request, admin.base_path());
    let admin = Arc::clone(admin);
    rocket::tokio::task::spawn_blocking(move || admin.is_signed_in(&neutral))
        .await
        .unwrap_or(false)
}

struct Serve<M: ManageConnection>(Arc<Admin<M>>);

impl<M: ManageConnection> Clone for Serve<M> {
    fn clone(&self) -> Self {
        Serve(Arc::clone(&self.0))
    }
}

#[rocket::async_trait]
impl<M> Handler for Serve<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    async fn handle<'r>(&self, request: &'r rocket::Request<'_>, data: Data<'r>) -> Outcome<'r> {
        let mut neutral = request_of(request, self.0.base_path());
        if request.method() == Method::Post {
            match data.open(MAX_FORM_BYTES.bytes()).into_bytes().await {
                Ok(body) if body.is_complete() => neutral = neutral.body(body.into_inner()),
                _ => return Outcome::Error(Status::PayloadTooLarge),
            }
        }
        let admin = Arc::clone(&self.0);
        let answered = rocket::tokio::task::spawn_blocking(move || admin.handle(&neutral)).await;
        let Ok(answer) = answered else {
            return Outcome::Error(Status::InternalServerError);
        };
        let mut response = rocket::Response::build();
        response.status(Status::new(answer.status));
        for (name, value) in answer.headers {
            response.raw_header_adjoin(name, value);
        }
        response.sized_body(answer.body.len(), Cursor::new(answer.body));
        Outcome::Success(response.finalize())
    }
}
