//! The pages and actions. Database work runs on Rocket's blocking pool, never on its async
//! threads.

use std::sync::atomic::Ordering;

use diesel::prelude::*;
use outbox_diesel::inbox::{InboxError, Received};
use outbox_diesel::subscription::{self, NewSubscription};
use rocket::data::{Data, ToByteUnit};
use rocket::form::Form;
use rocket::http::{ContentType, Status};
use rocket::request::{FromRequest, Outcome, Request};
use rocket::response::content::RawHtml;
use rocket::response::Redirect;
use rocket::{get, post, routes, uri, Route, State};

use crate::comments::{post_comment, NewComment, PostError};
use crate::db::{deliveries, hook_outcome, AnyConnection, DbConn};
use crate::messages::post_owner;
use crate::{pages, App};

pub fn all() -> Vec<Route> {
    routes![
        index,
        show_post,
        create_comment,
        receiver_log,
        receive_webhook,
        set_receiver_mode,
        metrics,
        webhooks,
        add_webhook,
        remove_webhook,
        receive_at_hook,
    ]
}

/// Runs `work` with a pooled connection on the blocking pool.
async fn blocking<T: Send + 'static>(
    app: &State<App>,
    work: impl FnOnce(&mut DbConn) -> Result<T, String> + Send + 'static,
) -> Result<T, Status> {
    let pool = app.db.clone();
    rocket::tokio::task::spawn_blocking(move || {
        let mut conn = pool.get().map_err(|e| e.to_string())?;
        work(&mut conn)
    })
    .await
    .map_err(|_| Status::InternalServerError)?
    .map_err(|error| {
        log::error!("blog: {error}");
        Status::InternalServerError
    })
}

#[get("/")]
fn index() -> Redirect {
    Redirect::to(uri!(show_post(id = 1, notice = _, error = _)))
}

#[get("/posts/<id>?<notice>&<error>")]
async fn show_post(
    app: &State<App>,
    id: i32,
    notice: Option<String>,
    error: Option<String>,
) -> Result<RawHtml<String>, Status> {
    let page = blocking(app, move |conn| {
        crate::db::post_page(conn, id).map_err(|e| e.to_string())
    })
    .await?;
    let (post, comments) = page.ok_or(Status::NotFound)?;
    Ok(pages::post(
        &post,
        &comments,
        notice.as_deref(),
        error.as_deref(),
    ))
}

/// Rejects state-changing requests a browser sends on behalf of another site.
struct SameSite_;

#[rocket::async_trait]
impl<'r> FromRequest<'r> for SameSite_ {
    type Error = &'static str;

    async fn from_request(request: &'r Request<'_>) -> Outcome<Self, Self::Error> {
        // The admin pages' rule, so that the blog's forms and the operator's agree.
        if outbox_admin::rocket::request_of(request, "").is_cross_site() {
            Outcome::Error((Status::Forbidden, "cross-site request refused"))
        } else {
            Outcome::Success(SameSite_)
        }
    }
}

#[post("/posts/<id>/comments", data = "<form>")]
async fn create_comment(
    app: &State<App>,
    _same_site: SameSite_,
    id: i32,
    form: Form<NewComment>,
) -> Result<Redirect, Status> {
    let comment = form.into_inner();
    let posted = blocking(app, move |conn| Ok(post_comment(conn, id, &comment))).await?;
    Ok(match posted {
        Ok(posted) => {
            let notice = match (posted.first_comment, posted.notified) {
                (true, 0) => "Thanks for your first comment! A thank-you mail is on its way.".to_owned(),
                (true, n) => format!("Thanks for your first comment! A thank-you mail is on its way, and {n} subscribers are being notified."),
                (false, n) => format!("Comment posted; {n} subscribers are being notified."),
            };
            Redirect::to(uri!(show_post(id = id, notice = Some(notice), error = _)))
        }
        Err(PostError::NoPost) => return Err(Status::NotFound),
        Err(PostError::Invalid(why)) => {
            Redirect::to(uri!(show_post(id = id, notice = _, error = Some(why))))
        }
        Err(PostError::Outbox(error)) => {
            log::error!("blog: posting a comment failed: {error}");
            return Err(Status::InternalServerError);
        }
    })
}

/// The receiver's log shows members' e-mail addresses: operators only.
#[get("/receiver")]
async fn receiver_log(
    app: &State<App>,
    admin: Option<Admin>,
) -> Result<Result<RawHtml<String>, Redirect>, Status> {
    if admin.is_none() {
        return Ok(Err(Redirect::to("/outbox/login?next=%2Freceiver")));
    }
    let failing = app.receiver_failing.load(Ordering::SeqCst);
    let log = blocking(app, |conn| {
        crate::db::recent_deliveries(conn, 100).map_err(|e| e.to_string())
    })
    .await?;
    Ok(Ok(pages::receiver(&log, failing)))
}

/// Every request header, for the signature check.
struct Headers(Vec<(String, String)>);

#[rocket::async_trait]
impl<'r> FromRequest<'r> for Headers {
    type Error = std::convert::Infallible;

    async fn from_request(request: &'r Request<'_>) -> Outcome<Self, Self::Error> {
        Outcome::Success(Headers(
            request
                .headers()
                .iter()
                .map(|h| (h.name().to_string(), h.value().to_string()))
                .collect(),
        ))
    }
}

/// What the receiver's log keeps of a request: anyone can post to `/receiver/hooks`, so each
/// line is bounded and only the latest lines are kept.
const LOGGED_BODY_BYTES: usize = 2048;
const LOGGED_ID_BYTES: usize = 255;
/// How many lines the receiver's log keeps.
pub const LOGGED_DELIVERIES: i64 = 1000;

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

fn log_delivery(
    conn: &mut AnyConnection,
    webhook_id: &str,
    body: &[u8],
    outcome: &str,
) -> QueryResult<usize> {
    let text = bounded(&String::from_utf8_lossy(body), LOGGED_BODY_BYTES);
    let webhook_id = bounded(webhook_id, LOGGED_ID_BYTES);
    let outcome = bounded(outcome, LOGGED_BODY_BYTES);
    let message_type = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let inserted = diesel::insert_into(deliveries::table)
        .values((
            deliveries::webhook_id.eq(webhook_id),
            deliveries::message_type.eq(bounded(&message_type, LOGGED_ID_BYTES)),
            deliveries::outcome.eq(outcome),
            deliveries::body.eq(text),
            deliveries::received_at.eq(now),
        ))
        .execute(conn)?;
    crate::db::keep_latest_deliveries(conn, LOGGED_DELIVERIES)?;
    Ok(inserted)
}

/// The stand-in mail service: verify, record once, answer.
#[post("/receiver/hooks", data = "<body>")]
async fn receive_webhook(
    app: &State<App>,
    headers: Headers,
    body: Data<'_>,
) -> Result<(Status, &'static str), Status> {
    let body = body
        .open(1.mebibytes())
        .into_bytes()
        .await
        .map_err(|_| Status::BadRequest)?
        .into_inner();
    let failing = app.receiver_failing.load(Ordering::SeqCst);
    let inbox = app.inbox.clone();
    blocking(app, move |conn| {
        let id = headers
            .0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("webhook-id"))
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        if failing {
            log_delivery(conn, &id, &body, "failed on purpose: answered 500")
                .map_err(|e| e.to_string())?;
            return Ok((
                Status::InternalServerError,
                "the receiver is switched to fail",
            ));
        }
        let received = inbox.receive(&mut **conn, &headers.0, &body, |conn, webhook| {
            log_delivery(conn, &webhook.id, &body, "verified, delivered")
        });
        match received {
            Ok(Received::Processed(_)) => Ok((Status::Ok, "received")),
            Ok(Received::Duplicate { id }) => {
                log_delivery(conn, &id, &body, "verified, duplicate: skipped")
                    .map_err(|e| e.to_string())?;
                Ok((Status::Ok, "already received"))
            }
            Err(InboxError::Verify(error)) => {
                log_delivery(conn, &id, &body, &format!("rejected: {error}"))
                    .map_err(|e| e.to_string())?;
                Ok((Status::Unauthorized, "signature rejected"))
            }
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

#[derive(rocket::FromForm)]
struct Mode {
    failing: String,
}

#[post("/receiver/mode", data = "<mode>")]
fn set_receiver_mode(
    app: &State<App>,
    _same_site: SameSite_,
    _admin: Admin,
    mode: Form<Mode>,
) -> Redirect {
    app.receiver_failing
        .store(mode.failing == "on", Ordering::SeqCst);
    Redirect::to(uri!(receiver_log))
}

/// An operator signed in on the outbox admin pages (their cookie is sent to every path).
struct Admin;

#[rocket::async_trait]
impl<'r> FromRequest<'r> for Admin {
    type Error = ();

    async fn from_request(request: &'r Request<'_>) -> Outcome<Self, Self::Error> {
        let Some(app) = request.rocket().state::<App>() else {
            return Outcome::Error((Status::InternalServerError, ()));
        };
        if outbox_admin::rocket::is_signed_in(&app.admin, request).await {
            Outcome::Success(Admin)
        } else {
            Outcome::Forward(Status::Unauthorized)
        }
    }
}

/// The worker's metrics in Prometheus' text format, for a scraper on the blog's loopback
/// address (counts and ages only: no payloads, addresses or secrets).
#[get("/metrics")]
fn metrics(app: &State<App>) -> Result<(ContentType, String), Status> {
    let handle = app.metrics.as_ref().ok_or(Status::NotFound)?;
    let prometheus_text = ContentType::new("text", "plain").with_params(("version", "0.0.4"));
    Ok((prometheus_text, handle.render()))
}

/// How many arrivals a post's webhooks page shows.
const SHOWN_HOOK_DELIVERIES: i64 = 50;

/// A post's webhook subscriptions and what arrived at their hooks.
#[get("/posts/<id>/webhooks?<notice>&<error>")]
async fn webhooks(
    app: &State<App>,
    id: i32,
    notice: Option<String>,
    error: Option<String>,
) -> Result<RawHtml<String>, Status> {
    let page = blocking(app, move |conn| {
        let Some((post, _)) = crate::db::post_page(conn, id).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let owner = post_owner(id);
        let listed =
            subscription::list(&mut **conn, Some(Some(&owner))).map_err(|e| e.to_string())?;
        let arrived = crate::db::hook_deliveries(conn, id, SHOWN_HOOK_DELIVERIES)
            .map_err(|e| e.to_string())?;
        Ok(Some((post, listed, arrived)))
    })
    .await?;
    let (post, listed, arrived) = page.ok_or(Status::NotFound)?;
    Ok(pages::webhooks(
        &post,
        &listed,
        &arrived,
        notice.as_deref(),
        error.as_deref(),
    ))
}

#[derive(rocket::FromForm)]
struct NewHook {
    /// Event-type filters, separated by commas or spaces.
    events: String,
}

/// Subscribes a new hook to the post's events: the hook stands in for the reader's endpoint.
#[post("/posts/<id>/webhooks", data = "<form>")]
async fn add_webhook(
    app: &State<App>,
    _same_site: SameSite_,
    id: i32,
    form: Form<NewHook>,
) -> Result<Redirect, Status> {
    let events: Vec<String> = form
        .events
        .split([',', ' '])
        .map(str::trim)
        .filter(|filter| !filter.is_empty())
        .map(str::to_owned)
        .collect();
    let hook = format!("post-{id}-{}", crate::hook_tag());
    let url = format!("{}/receiver/readers/{hook}", app.base_url);
    let subscriptions = app.subscriptions.clone();
    let secret = app.webhook_secret.expose_whsec();
    let created = blocking(app, move |conn| {
        if crate::db::post_page(conn, id)
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Ok(None);
        }
        let new = NewSubscription::new(url, events)
            .owner(post_owner(id))
            .secret(secret)
            .allow_http()
            .description(format!("a reader's hook on post {id}"));
        Ok(Some(subscriptions.create(&mut **conn, &new)))
    })
    .await?;
    Ok(match created.ok_or(Status::NotFound)? {
        Ok(created) => {
            let notice = format!(
                "Subscribed {}: the next comment on this post that it asks for arrives below.",
                created.subscription.id
            );
            Redirect::to(uri!(webhooks(id = id, notice = Some(notice), error = _)))
        }
        Err(outbox_diesel::Error::InvalidSubscription { reason }) => {
            let error = format!("Not subscribed: {reason}.");
            Redirect::to(uri!(webhooks(id = id, notice = _, error = Some(error))))
        }
        Err(error) => {
            log::error!("blog: adding a subscription failed: {error}");
            return Err(Status::InternalServerError);
        }
    })
}

#[derive(rocket::FromForm)]
struct RemovedHook {
    subscription: String,
}

/// Removes one of the post's subscriptions (never another post's).
#[post("/posts/<id>/webhooks/remove", data = "<form>")]
async fn remove_webhook(
    app: &State<App>,
    _same_site: SameSite_,
    id: i32,
    form: Form<RemovedHook>,
) -> Result<Redirect, Status> {
    let subscription_id = form.into_inner().subscription;
    let removed = blocking(app, move |conn| {
        outbox_diesel::write_transaction(&mut **conn, |conn| {
            let owned = subscription::get(conn, &subscription_id)?
                .is_some_and(|found| found.owner.as_deref() == Some(post_owner(id).as_str()));
            if owned {
                subscription::remove(conn, &subscription_id)
            } else {
                Ok(false)
            }
        })
        .map_err(|e: outbox_diesel::Error| e.to_string())
    })
    .await?;
    let notice = if removed {
        "Subscription removed: its waiting deliveries are gone with it."
    } else {
        "No such subscription on this post."
    };
    Ok(Redirect::to(uri!(webhooks(
        id = id,
        notice = Some(notice),
        error = _
    ))))
}

/// A reader's stand-in endpoint: logs each verified arrival, every time it arrives (at least
/// once: a retried delivery shows twice), and refuses what is not signed by the blog.
#[post("/receiver/readers/<hook>", data = "<body>")]
async fn receive_at_hook(
    app: &State<App>,
    hook: &str,
    headers: Headers,
    body: Data<'_>,
) -> Result<(Status, &'static str), Status> {
    let body = body
        .open(1.mebibytes())
        .into_bytes()
        .await
        .map_err(|_| Status::BadRequest)?
        .into_inner();
    let verified = outbox_diesel::webhook::verify(
        std::slice::from_ref(&app.webhook_secret),
        &headers.0,
        &body,
        outbox_diesel::webhook::DEFAULT_TOLERANCE,
    );
    let webhook = match verified {
        Ok(webhook) => webhook,
        Err(error) => {
            log::warn!("blog: a delivery to hook {hook} was refused: {error}");
            return Ok((Status::Unauthorized, "signature rejected"));
        }
    };
    let outcome = hook_outcome(hook);
    blocking(app, move |conn| {
        log_delivery(conn, &webhook.id, &body, &outcome).map_err(|e| e.to_string())
    })
    .await?;
    Ok((Status::Ok, "received"))
}
