//! Which request gets which answer: sign-in first, then the pages, the actions and the JSON.

use std::time::{SystemTime, UNIX_EPOCH};

use diesel::r2d2::ManageConnection;
use outbox_diesel::admin::{
    self, CancelSelection, DeadLetterSelection, FoundMessage, ListOptions, PauseKind,
};
use outbox_diesel::delivery_log::{self, AttemptFilter, LoggedAttempt, Replay, ReplayTarget};
use outbox_diesel::subscription::{self, NewSubscription};
use outbox_diesel::{MessageId, OutboxConnection};
use serde_json::{json, Value};

use crate::chart::Sample;
use crate::http::{Params, Request, Response};
use crate::pages::{self, Bulk, DeadPage, Overview, Page, PendingPage};
use crate::Admin;

/// Messages per page.
pub(crate) const PAGE: u32 = 50;
/// Blocked keys on the overview.
const BLOCKED_SHOWN: u32 = 20;
/// The cookie that carries an action's outcome to the page it redirects to.
const FLASH: &str = "outbox_admin_flash";

type Outcome = Result<Response, String>;

pub(crate) fn handle<M>(admin: &Admin<M>, request: &Request) -> Response
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let method = request.method();
    if method != "GET" && method != "POST" {
        return Response::html(
            405,
            pages::problem(admin.base_path(), "Method not allowed."),
        );
    }
    if method == "POST" && request.is_cross_site() {
        log::warn!(
            target: "outbox_admin",
            "refused a cross-site POST to {} from {}",
            request.path(),
            request.peer_or_unknown()
        );
        return Response::html(
            403,
            pages::problem(admin.base_path(), "Cross-site request refused."),
        );
    }
    let segments: Vec<&str> = request
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match (method, segments.as_slice()) {
        ("GET", ["login"]) => return login_form(admin, request, None, 200),
        ("POST", ["login"]) => return login(admin, request),
        ("POST", ["logout"]) => return logout(admin, request),
        _ => {}
    }
    let api = segments.first() == Some(&"api");
    let signed_in = match signed_in(admin, request) {
        Ok(signed_in) => signed_in || (api && admin.sessions.bearer(request)),
        Err(error) => return server_error(admin.base_path(), api, &error),
    };
    if !signed_in {
        return if api {
            Response::json(
                401,
                &json!({"error": "sign in, or send Authorization: Bearer <admin token>"}),
            )
        } else if method == "GET" {
            let next = format!("{}{}", admin.base_path(), request.path());
            let request_with_next = Request::new("GET", "/login").header("x-next", &next);
            login_form(admin, &request_with_next, None, 401)
        } else {
            Response::html(401, pages::problem(admin.base_path(), "Sign in first."))
        };
    }
    let flash = read_flash(request);
    let page = Page {
        base: admin.base_path(),
        flash: flash.as_deref(),
    };
    let query = request.query();
    let outcome = match (method, segments.as_slice()) {
        ("GET", []) => overview(admin, page),
        ("GET", ["messages"]) => pending(admin, page, &query),
        ("GET", ["messages", id]) => message(admin, page, id),
        ("POST", ["messages", "cancel"]) => cancel(admin, request, CancelFrom::Pending),
        ("POST", ["messages", id, "cancel"]) => cancel(admin, request, CancelFrom::Message(id)),
        ("POST", ["subscriptions", id, "cancel"]) => {
            cancel(admin, request, CancelFrom::Subscription(id))
        }
        ("POST", ["api", "cancel"]) => cancel(admin, request, CancelFrom::Api),
        ("GET", ["find"]) => find(admin, &query),
        ("GET", ["dead"]) => dead(admin, page, &query),
        ("GET", ["dead", "confirm"]) => confirm(admin, page, &query, None),
        ("POST", ["dead", action @ ("requeue" | "purge")]) => bulk(admin, page, request, action),
        ("POST", ["dead", position, action @ ("requeue" | "purge")]) => {
            one(admin, request, position, action)
        }
        ("GET", ["api", "overview"]) => overview_json(admin),
        ("GET", ["api", "messages"]) => pending_json(admin, &query),
        ("GET", ["api", "messages", id]) => message_json(admin, id),
        ("GET", ["api", "dead"]) => dead_json(admin, &query),
        ("GET", ["deliveries"]) => deliveries(admin, page, &query),
        ("POST", ["deliveries", "replay"]) => replay(admin, request, false),
        ("POST", ["api", "replay"]) => replay(admin, request, true),
        ("POST", ["messages", id, "resend"]) => resend(admin, request, Some(id)),
        ("POST", ["api", "resend"]) => resend(admin, request, None),
        ("GET", ["api", "attempts"]) => attempts_json(admin, &query),
        ("GET", ["api", "blocked"]) => blocked_json(admin),
        ("GET", ["api", "destinations"]) => destinations_json(admin),
        ("POST", ["destinations", name, "enable"]) => enable_destination(admin, request, name),
        ("GET", ["api", "paused"]) => paused_json(admin),
        ("GET", ["subscriptions"]) => subscriptions_page(admin, page),
        ("GET", ["api", "subscriptions"]) => subscriptions_json(admin),
        ("POST", ["subscriptions"]) => add_subscription(admin, page, request),
        (
            "POST",
            ["subscriptions", id, action @ ("enable" | "disable" | "remove" | "rotate-secret")],
        ) => change_subscription(admin, page, request, id, action),
        ("POST", [kind @ ("types" | "destinations"), name, action @ ("pause" | "resume")]) => {
            pause_or_resume(admin, request, kind, name, action)
        }
        _ if api => Ok(Response::json(404, &json!({"error": "no such endpoint"}))),
        _ => Ok(Response::html(
            404,
            pages::problem(admin.base_path(), "No such page."),
        )),
    };
    let response = outcome.unwrap_or_else(|error| {
        log::error!(target: "outbox_admin", "{} {}: {error}", method, request.path());
        server_error(admin.base_path(), api, &error)
    });
    if flash.is_some() {
        response.set_cookie(flash_cookie(admin.base_path(), "", 0))
    } else {
        response
    }
}

fn read_flash(request: &Request) -> Option<String> {
    let value = request.cookie(FLASH).filter(|v| !v.is_empty())?;
    form_urlencoded::parse(format!("m={value}").as_bytes())
        .next()
        .map(|(_, text)| text.into_owned())
}

fn flash_cookie(base: &str, text: &str, max_age: u32) -> String {
    let value: String = form_urlencoded::byte_serialize(text.as_bytes()).collect();
    format!("{FLASH}={value}; Path={base}; Max-Age={max_age}; HttpOnly; SameSite=Strict")
}

/// A redirect to `path` (below the base) that shows `text` there once.
fn done(base: &str, path: &str, text: &str) -> Response {
    Response::redirect(&format!("{base}{path}")).set_cookie(flash_cookie(base, text, 60))
}

/// Where to go after signing in: a path of this site only (never `//host` or a URL).
fn safe_next(base: &str, next: Option<&str>) -> String {
    match next {
        Some(next)
            if next.starts_with('/')
                && !next.starts_with("//")
                && !next.contains(|c: char| c == '\\' || c.is_control()) =>
        {
            next.to_owned()
        }
        _ => format!("{base}/"),
    }
}

fn login_form<M: ManageConnection>(
    admin: &Admin<M>,
    request: &Request,
    error: Option<&str>,
    status: u16,
) -> Response {
    let query = request.query();
    let next = safe_next(
        admin.base_path(),
        request.header_value("x-next").or(query.get("next")),
    );
    Response::html(status, pages::login(admin.base_path(), &next, error))
}

/// Whether the request's session cookie is authentic, unexpired and not signed out.
pub(crate) fn signed_in<M>(admin: &Admin<M>, request: &Request) -> Result<bool, String>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Some(session) = admin.sessions.session(request) else {
        return Ok(false);
    };
    let revoked =
        admin::admin_session_revoked(&mut *connection(admin)?, &session.id).map_err(text)?;
    Ok(!revoked)
}

/// Signs out: the cookie is cleared here and its session refused everywhere after.
fn logout<M>(admin: &Admin<M>, request: &Request) -> Response
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    if let Some(session) = admin.sessions.session(request) {
        let revoked = connection(admin).and_then(|mut conn| {
            admin::revoke_admin_session(&mut *conn, &session.id, session.expires).map_err(text)
        });
        if let Err(error) = revoked {
            // The cookie would stay valid elsewhere: say so rather than pretend.
            return server_error(
                admin.base_path(),
                false,
                &format!("could not sign out: {error}"),
            );
        }
        log::info!(target: "outbox_admin", "an operator signed out from {}", request.peer_or_unknown());
    }
    Response::redirect(&format!("{}/login", admin.base_path())).set_cookie(admin.sessions.clear())
}

fn login<M: ManageConnection>(admin: &Admin<M>, request: &Request) -> Response {
    let form = request.form();
    let next = safe_next(admin.base_path(), form.get("next"));
    if admin
        .sessions
        .is_token(form.get("token").unwrap_or_default())
    {
        let cookie = match admin.sessions.issue() {
            Ok(cookie) => cookie,
            Err(error) => return server_error(admin.base_path(), false, &error.to_string()),
        };
        log::info!(target: "outbox_admin", "an operator signed in from {}", request.peer_or_unknown());
        Response::redirect(&next).set_cookie(cookie)
    } else {
        log::warn!(
            target: "outbox_admin",
            "a sign-in with a wrong token from {}",
            request.peer_or_unknown()
        );
        Response::html(
            401,
            pages::login(
                admin.base_path(),
                &next,
                Some("That is not the admin token."),
            ),
        )
    }
}

fn connection<M>(admin: &Admin<M>) -> Result<diesel::r2d2::PooledConnection<M>, String>
where
    M: ManageConnection,
{
    admin
        .pool
        .get()
        .map_err(|e| format!("no database connection: {e}"))
}

fn text<E: std::fmt::Display>(error: E) -> String {
    error.to_string()
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The overview's figures, recording a sample for the charts.
fn overview_data<M>(admin: &Admin<M>) -> Result<Overview, String>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let mut conn = connection(admin)?;
    let conn = &mut *conn;
    let backlog = admin::backlog(conn).map_err(text)?;
    let stats = admin::stats(conn).map_err(text)?;
    let blocked = admin::blocked_keys(conn, BLOCKED_SHOWN).map_err(text)?;
    let settled = admin
        .worker_stats
        .as_ref()
        .map(|stats| stats())
        .map(|s| s.succeeded + s.dead_lettered);
    let mut samples = admin
        .samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    samples.record(Sample {
        at: SystemTime::now(),
        pending: backlog.pending,
        oldest_due_age: backlog.oldest_due_age,
        settled,
    });
    Ok(Overview {
        pending: backlog.pending,
        in_flight: stats.iter().map(|s| s.in_flight).sum(),
        dead: stats.iter().map(|s| s.dead).sum(),
        oldest_due_age: backlog.oldest_due_age,
        oldest_transaction_age: backlog.oldest_transaction_age,
        long_transaction: backlog.long_transaction(),
        dead_rows: backlog.dead_rows,
        settled_per_second: samples.latest_rate(),
        has_worker: admin.worker_stats.is_some(),
        samples: samples.all().copied().collect(),
        rates: samples.rates(),
        stats,
        blocked,
        destinations: admin::destinations(conn).map_err(text)?,
        pauses: admin::pauses(conn).map_err(text)?,
        refresh: admin.refresh,
    })
}

fn destinations_json<M>(admin: &Admin<M>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let destinations = admin::destinations(&mut *connection(admin)?).map_err(text)?;
    Ok(Response::json(
        200,
        &json!({ "destinations": destinations }),
    ))
}

fn paused_json<M>(admin: &Admin<M>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let pauses = admin::pauses(&mut *connection(admin)?).map_err(text)?;
    Ok(Response::json(200, &json!({ "paused": pauses })))
}

/// An operator's pause or resume of a message type (`types`) or a destination.
fn pause_or_resume<M>(
    admin: &Admin<M>,
    request: &Request,
    kind: &str,
    name: &str,
    action: &str,
) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    let (kind, what) = if kind == "types" {
        (PauseKind::MessageType, "message type")
    } else {
        (PauseKind::Destination, "destination")
    };
    let peer = request.peer_or_unknown();
    let mut conn = connection(admin)?;
    let text = match action {
        "pause" => {
            let reason = format!("paused from the admin pages by {peer}");
            match admin::pause(&mut *conn, kind, &name, &reason) {
                Ok(true) => format!(
                    "Paused {what} {name}: within a few seconds no worker handles its messages; \
                     they stay pending, spending no attempt, until resumed."
                ),
                Ok(false) => format!("{what} {name} was paused already."),
                Err(error @ outbox_diesel::Error::InvalidPauseName { .. }) => {
                    return Ok(Response::html(
                        400,
                        pages::problem(admin.base_path(), &error.to_string()),
                    ))
                }
                Err(error) => return Err(error.to_string()),
            }
        }
        _ => match admin::resume(&mut *conn, kind, &name).map_err(text)? {
            Some(released) => format!(
                "Resumed {what} {name}: {released} paused messages are due again; the workers \
                 follow within a few seconds."
            ),
            None => format!("{what} {name} was not paused."),
        },
    };
    log::info!(target: "outbox_admin", "{what} {name}: {action} by an operator from {peer}");
    Ok(done(admin.base_path(), "/", &text))
}

fn subscriptions_page<M>(admin: &Admin<M>, page: Page<'_>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let listed = subscription::list(&mut *connection(admin)?, None).map_err(text)?;
    Ok(Response::html(
        200,
        pages::subscriptions(page, &listed, admin.subscriptions.is_some()),
    ))
}

fn subscriptions_json<M>(admin: &Admin<M>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let listed = subscription::list(&mut *connection(admin)?, None).map_err(text)?;
    Ok(Response::json(200, &json!({ "subscriptions": listed })))
}

/// Why the pages cannot make secrets: the application gave them no subscription settings.
const NO_SUBSCRIPTION_SETTINGS: &str = "These pages make no secrets: give them the application's \
     subscription settings (AdminBuilder::subscriptions), or use the application or `outbox \
     subscription`.";

fn add_subscription<M>(admin: &Admin<M>, page: Page<'_>, request: &Request) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Some(settings) = &admin.subscriptions else {
        return Ok(Response::html(
            400,
            pages::problem(admin.base_path(), NO_SUBSCRIPTION_SETTINGS),
        ));
    };
    let form = request.form();
    let url = form.get("url").unwrap_or_default();
    let event_types: Vec<&str> = form
        .get("event_types")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|filter| !filter.is_empty())
        .collect();
    let mut new = NewSubscription::new(url, event_types);
    if let Some(owner) = form.get("owner") {
        new = new.owner(owner);
    }
    if let Some(description) = form.get("description") {
        new = new.description(description);
    }
    if form.get("allow_http").is_some() {
        new = new.allow_http();
    }
    let created = match settings.create(&mut *connection(admin)?, &new) {
        Ok(created) => created,
        Err(
            error @ (outbox_diesel::Error::InvalidSubscription { .. }
            | outbox_diesel::Error::InvalidOwner),
        ) => {
            return Ok(Response::html(
                400,
                pages::problem(admin.base_path(), &error.to_string()),
            ))
        }
        Err(error) => return Err(error.to_string()),
    };
    log::info!(
        target: "outbox_admin",
        "subscription {} added by an operator from {}",
        created.subscription.id,
        request.peer_or_unknown()
    );
    Ok(Response::html(
        200,
        pages::secret_once(page, &created.subscription.id, &created.secret, "added"),
    ))
}

fn change_subscription<M>(
    admin: &Admin<M>,
    page: Page<'_>,
    request: &Request,
    id: &str,
    action: &str,
) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
    let mut conn = connection(admin)?;
    let peer = request.peer_or_unknown();
    let (found, done_text) = match action {
        "enable" => (
            subscription::enable(&mut *conn, &id).map_err(text)?,
            format!("Enabled subscription {id}: its paused deliveries are due now."),
        ),
        "disable" => (
            subscription::disable(&mut *conn, &id).map_err(text)?,
            format!(
                "Disabled subscription {id}: within a few seconds no new event reaches it and \
                 its waiting deliveries pause."
            ),
        ),
        "remove" => (
            subscription::remove(&mut *conn, &id).map_err(text)?,
            format!("Removed subscription {id} and its waiting deliveries."),
        ),
        _ => {
            let Some(settings) = &admin.subscriptions else {
                return Ok(Response::html(
                    400,
                    pages::problem(admin.base_path(), NO_SUBSCRIPTION_SETTINGS),
                ));
            };
            let rotated = settings
                .rotate_secret(
                    &mut *conn,
                    &id,
                    outbox_diesel::subscription::DEFAULT_ROTATION_OVERLAP,
                )
                .map_err(text)?;
            log::info!(
                target: "outbox_admin",
                "subscription {id}: secret rotated by an operator from {peer}"
            );
            return Ok(match rotated {
                Some(secret) => {
                    Response::html(200, pages::secret_once(page, &id, &secret, "rotated"))
                }
                None => Response::html(
                    404,
                    pages::problem(admin.base_path(), "No such subscription."),
                ),
            });
        }
    };
    if !found {
        return Ok(Response::html(
            404,
            pages::problem(admin.base_path(), "No such subscription."),
        ));
    }
    log::info!(target: "outbox_admin", "subscription {id}: {action} by an operator from {peer}");
    Ok(done(admin.base_path(), "/subscriptions", &done_text))
}

fn enable_destination<M>(admin: &Admin<M>, request: &Request, name: &str) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    if !admin::enable_destination(&mut *connection(admin)?, &name).map_err(text)? {
        return Ok(Response::html(
            404,
            pages::problem(admin.base_path(), "No such destination."),
        ));
    }
    log::info!(
        target: "outbox_admin",
        "destination {name} enabled by an operator from {}",
        request.peer_or_unknown()
    );
    Ok(done(
        admin.base_path(),
        "/",
        &format!(
            "Enabled destination {name}: the workers deliver to it again within a few seconds. \
             Re-queue its dead letters to deliver them."
        ),
    ))
}

fn overview<M>(admin: &Admin<M>, page: Page<'_>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    Ok(Response::html(
        200,
        pages::overview(page, &overview_data(admin)?),
    ))
}

fn overview_json<M>(admin: &Admin<M>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let o = overview_data(admin)?;
    let samples: Vec<Value> = o
        .samples
        .iter()
        .zip(&o.rates)
        .map(|(s, rate)| {
            json!({
                "at_unix_ms": unix_ms(s.at),
                "pending": s.pending,
                "oldest_due_age_seconds": s.oldest_due_age.as_secs_f64(),
                "settled_per_second": rate,
            })
        })
        .collect();
    Ok(Response::json(
        200,
        &json!({
            "pending": o.pending,
            "in_flight": o.in_flight,
            "dead": o.dead,
            "oldest_due_age_seconds": o.oldest_due_age.as_secs_f64(),
            "oldest_transaction_age_seconds": o.oldest_transaction_age.map(|a| a.as_secs_f64()),
            "dead_rows": o.dead_rows,
            "settled_per_second": o.settled_per_second,
            "types": o.stats,
            "paused": o.pauses,
            "samples": samples,
        }),
    ))
}

/// The listing filters a query asks for, and the page it starts after.
fn list_options(query: &Params) -> Result<ListOptions, String> {
    let mut options = ListOptions::new()
        .limit(PAGE + 1)
        .payload_preview(admin::PREVIEW_CHARS);
    if let Some(t) = query.get("type") {
        options = options.message_type(t);
    }
    if let Some(key) = query.get("key") {
        options = options.ordering_key(key);
    }
    if let Some(attempts) = query.get("min_attempts") {
        let attempts = attempts
            .parse()
            .map_err(|_| format!("min_attempts `{attempts}` is not a count"))?;
        options = options.min_attempts(attempts);
    }
    if query.get("due").is_some_and(|due| due != "0") {
        options = options.due_only();
    }
    if let Some(after) = query.get("after") {
        let after = after
            .parse()
            .map_err(|_| format!("after `{after}` is not a position"))?;
        options = options.after(after);
    }
    Ok(options)
}

/// Cuts a listing fetched with one extra row to a page; the position to continue after, if
/// there is more.
fn paged<T>(mut rows: Vec<T>, position: impl Fn(&T) -> i64) -> (Vec<T>, Option<i64>) {
    let page = usize::try_from(PAGE).unwrap_or(usize::MAX);
    if rows.len() > page {
        rows.truncate(page);
        let next = rows.last().map(position);
        (rows, next)
    } else {
        (rows, None)
    }
}

/// The page of a listing the query asks for and the position to continue after, or the
/// answer to a query that makes no sense.
type Listed<T> = Result<Result<(Vec<T>, Option<i64>), Response>, String>;

fn listed<M, T>(
    admin: &Admin<M>,
    query: &Params,
    api: bool,
    load: impl FnOnce(&mut M::Connection, &ListOptions) -> outbox_diesel::Result<Vec<T>>,
    position: impl Fn(&T) -> i64,
) -> Listed<T>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let options = match list_options(query) {
        Ok(options) => options,
        Err(error) => return Ok(Err(bad_request(admin.base_path(), api, &error))),
    };
    let mut conn = connection(admin)?;
    let rows = load(&mut conn, &options).map_err(text)?;
    Ok(Ok(paged(rows, position)))
}

fn server_error(base: &str, api: bool, error: &str) -> Response {
    if api {
        Response::json(500, &json!({ "error": error }))
    } else {
        Response::html(500, pages::problem(base, error))
    }
}

fn bad_request(base: &str, api: bool, error: &str) -> Response {
    if api {
        Response::json(400, &json!({ "error": error }))
    } else {
        Response::html(400, pages::problem(base, error))
    }
}

fn pending<M>(admin: &Admin<M>, page: Page<'_>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let (messages, next_after) =
        match listed(admin, query, false, admin::pending_messages, |m| m.position)? {
            Ok(page) => page,
            Err(answer) => return Ok(answer),
        };
    Ok(Response::html(
        200,
        pages::pending(
            page,
            &PendingPage {
                query,
                messages: &messages,
                next_after,
            },
        ),
    ))
}

fn pending_json<M>(admin: &Admin<M>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let (messages, next_after) =
        match listed(admin, query, true, admin::pending_messages, |m| m.position)? {
            Ok(page) => page,
            Err(answer) => return Ok(answer),
        };
    Ok(Response::json(
        200,
        &json!({ "messages": messages, "next_after": next_after }),
    ))
}

fn found<M>(admin: &Admin<M>, id: &str) -> Result<Result<Option<FoundMessage>, String>, String>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Ok(message_id) = id.parse::<MessageId>() else {
        return Ok(Err(format!("`{id}` is not a message id (a UUID)")));
    };
    let mut conn = connection(admin)?;
    Ok(Ok(
        admin::find_message(&mut *conn, message_id).map_err(text)?
    ))
}

/// Message `id`'s exchanges in the delivery log, newest first (none for an id that is not one).
fn message_attempts<M>(admin: &Admin<M>, id: &str) -> Result<Vec<LoggedAttempt>, String>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Ok(message_id) = id.parse::<MessageId>() else {
        return Ok(Vec::new());
    };
    let mut conn = connection(admin)?;
    let filter = AttemptFilter {
        limit: MESSAGE_ATTEMPTS,
        ..AttemptFilter::default().message(message_id)
    };
    delivery_log::attempts(&mut *conn, &filter).map_err(text)
}

/// The most attempts a message's page lists.
const MESSAGE_ATTEMPTS: u32 = 200;

fn message<M>(admin: &Admin<M>, page: Page<'_>, id: &str) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    Ok(match found(admin, id)? {
        Err(error) => bad_request(page.base, false, &error),
        Ok(None) => {
            let attempts = message_attempts(admin, id)?;
            let status = if attempts.is_empty() { 404 } else { 200 };
            Response::html(status, pages::not_found_message(page, id, &attempts))
        }
        Ok(Some(message)) => {
            let attempts = message_attempts(admin, id)?;
            Response::html(200, pages::message(page, &message, &attempts))
        }
    })
}

/// The delivery log's filters, from a query: `destination`, `subscription`, `type`,
/// `failures=1`, `since` and `until` (RFC 3339 or an age, `1h`), `before` (an attempt's id:
/// the page after it).
fn attempt_filter(query: &Params) -> Result<AttemptFilter, String> {
    let before = match query.get("before") {
        Some(before) => Some(
            before
                .parse::<i64>()
                .map_err(|_| format!("`before` must be an attempt's id, not `{before}`"))?,
        ),
        None => None,
    };
    let time = |name: &str| query.get(name).map(delivery_log::parse_time).transpose();
    Ok(AttemptFilter {
        destination: query.get("destination").map(str::to_owned),
        subscription_id: query.get("subscription").map(str::to_owned),
        message_type: query.get("type").map(str::to_owned),
        failures_only: query.get("failures").is_some_and(|on| on != "0"),
        since: time("since")?,
        until: time("until")?,
        before,
        limit: DELIVERIES_PAGE,
        ..AttemptFilter::default()
    })
}

/// Attempts a page of the delivery log lists.
const DELIVERIES_PAGE: u32 = 100;

/// A page of the delivery log: its attempts, and the id to read the next page before.
type LogPage = (Vec<LoggedAttempt>, Option<i64>);

/// The delivery log, newest first, filtered; or the problem with the filters.
fn logged<M>(admin: &Admin<M>, query: &Params) -> Result<Result<LogPage, String>, String>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let filter = match attempt_filter(query) {
        Ok(filter) => filter,
        Err(problem) => return Ok(Err(problem)),
    };
    let mut conn = connection(admin)?;
    let attempts = delivery_log::attempts(&mut *conn, &filter).map_err(text)?;
    let next_before = (attempts.len() == filter.limit as usize)
        .then(|| attempts.last().map(|a| a.id))
        .flatten();
    Ok(Ok((attempts, next_before)))
}

fn deliveries<M>(admin: &Admin<M>, page: Page<'_>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    Ok(match logged(admin, query)? {
        Err(problem) => bad_request(page.base, false, &problem),
        Ok((attempts, next_before)) => {
            Response::html(200, pages::deliveries(page, query, &attempts, next_before))
        }
    })
}

fn attempts_json<M>(admin: &Admin<M>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    Ok(match logged(admin, query)? {
        Err(problem) => bad_request(admin.base_path(), true, &problem),
        Ok((attempts, next_before)) => Response::json(
            200,
            &json!({ "attempts": attempts, "next_before": next_before }),
        ),
    })
}

fn message_json<M>(admin: &Admin<M>, id: &str) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let found = found(admin, id)?;
    let attempts = message_attempts(admin, id)?;
    Ok(match found {
        Err(error) => bad_request(admin.base_path(), true, &error),
        Ok(None) if attempts.is_empty() => Response::json(
            404,
            &json!({"error": "no such message: delivered and its log pruned, cancelled, purged, or never enqueued"}),
        ),
        Ok(None) => Response::json(
            200,
            &json!({"state": "not_in_outbox", "attempts": attempts}),
        ),
        Ok(Some(FoundMessage::Pending(m))) => Response::json(
            200,
            &json!({"state": "pending", "message": m, "attempts": attempts}),
        ),
        Ok(Some(FoundMessage::Dead(d))) => Response::json(
            200,
            &json!({"state": "dead", "message": d, "attempts": attempts}),
        ),
    })
}

/// The search box: to the message page of a valid id.
fn find<M>(admin: &Admin<M>, query: &Params) -> Outcome
where
    M: ManageConnection,
{
    let id = query.get("id").unwrap_or_default();
    Ok(match id.parse::<MessageId>() {
        Ok(id) => Response::redirect(&format!("{}/messages/{id}", admin.base_path())),
        Err(_) => bad_request(
            admin.base_path(),
            false,
            &format!("`{id}` is not a message id (a UUID)"),
        ),
    })
}

fn dead<M>(admin: &Admin<M>, page: Page<'_>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let (letters, next_after) =
        match listed(admin, query, false, admin::dead_letters, |d| d.position)? {
            Ok(page) => page,
            Err(answer) => return Ok(answer),
        };
    let mut conn = connection(admin)?;
    let types: Vec<(String, u64)> = admin::stats(&mut *conn)
        .map_err(text)?
        .into_iter()
        .filter(|s| s.dead > 0)
        .map(|s| (s.message_type, s.dead))
        .collect();
    Ok(Response::html(
        200,
        pages::dead(
            page,
            &DeadPage {
                query,
                letters: &letters,
                next_after,
                types: &types,
            },
        ),
    ))
}

fn dead_json<M>(admin: &Admin<M>, query: &Params) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let (letters, next_after) =
        match listed(admin, query, true, admin::dead_letters, |d| d.position)? {
            Ok(page) => page,
            Err(answer) => return Ok(answer),
        };
    Ok(Response::json(
        200,
        &json!({ "dead_letters": letters, "next_after": next_after }),
    ))
}

fn blocked_json<M>(admin: &Admin<M>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let mut conn = connection(admin)?;
    let blocked = admin::blocked_keys(&mut *conn, 1000).map_err(text)?;
    Ok(Response::json(200, &json!({ "blocked_keys": blocked })))
}

/// Which bulk action a confirmation is for, and what it selects.
fn bulk_of<'q>(action: &str, params: &'q Params) -> Option<Bulk<'q>> {
    let requeue = match action {
        "requeue" => true,
        "purge" => false,
        _ => return None,
    };
    Some(Bulk {
        requeue,
        message_type: params.get("type"),
    })
}

/// The confirmation of a bulk action, stating how many dead letters it selects now.
/// `changed`: the count the operator confirmed, when it no longer holds.
fn confirm<M>(admin: &Admin<M>, page: Page<'_>, query: &Params, changed: Option<usize>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Some(bulk) = query.get("action").and_then(|a| bulk_of(a, query)) else {
        return Ok(bad_request(
            page.base,
            false,
            "action must be requeue or purge",
        ));
    };
    let mut conn = connection(admin)?;
    let count = admin::dead_letter_positions(&mut *conn, bulk.message_type)
        .map_err(text)?
        .len();
    let status = if changed.is_some() { 409 } else { 200 };
    Ok(Response::html(
        status,
        pages::confirm(page, bulk, count, changed),
    ))
}

fn bulk<M>(admin: &Admin<M>, page: Page<'_>, request: &Request, action: &str) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let form = request.form();
    let Some(bulk) = bulk_of(action, &form) else {
        return Ok(bad_request(
            page.base,
            false,
            "action must be requeue or purge",
        ));
    };
    let Some(confirmed) = form.get("count").and_then(|c| c.parse::<usize>().ok()) else {
        return Ok(bad_request(
            page.base,
            false,
            "the confirmed count is missing",
        ));
    };
    let mut conn = connection(admin)?;
    let conn = &mut *conn;
    let positions = admin::dead_letter_positions(conn, bulk.message_type).map_err(text)?;
    if positions.len() != confirmed {
        drop(positions);
        let mut query = format!("action={action}");
        if let Some(t) = bulk.message_type {
            query.push_str("&type=");
            query.extend(form_urlencoded::byte_serialize(t.as_bytes()));
        }
        let query = Request::new("GET", &format!("/?{query}")).query();
        return confirm(admin, page, &query, Some(confirmed));
    }
    let selection = DeadLetterSelection::Positions(positions);
    let of = match bulk.message_type {
        Some(t) => format!(" of type {t}"),
        None => String::new(),
    };
    let text_done = if bulk.requeue {
        let moved = admin::requeue_dead_letters(conn, &selection).map_err(text)?;
        format!("Re-queued {}{of}.", pages::dead_letters(moved.len()))
    } else {
        let purged = admin::purge_dead_letters(conn, &selection).map_err(text)?;
        format!("Purged {}{of}.", pages::dead_letters(purged))
    };
    log::info!(
        target: "outbox_admin",
        "{} (confirmed {confirmed}) by an operator from {}",
        text_done.trim_end_matches('.'),
        request.peer_or_unknown()
    );
    Ok(done(page.base, "/dead", &text_done))
}

fn one<M>(admin: &Admin<M>, request: &Request, position: &str, action: &str) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let Ok(position) = position.parse::<i64>() else {
        return Ok(bad_request(
            admin.base_path(),
            false,
            &format!("`{position}` is not a position"),
        ));
    };
    let selection = DeadLetterSelection::Positions(vec![position]);
    let mut conn = connection(admin)?;
    let conn = &mut *conn;
    let text_done = if action == "requeue" {
        match admin::requeue_dead_letters(conn, &selection)
            .map_err(text)?
            .len()
        {
            0 => format!("Dead letter #{position} is gone already."),
            _ => format!("Re-queued dead letter #{position}."),
        }
    } else {
        match admin::purge_dead_letters(conn, &selection).map_err(text)? {
            0 => format!("Dead letter #{position} is gone already."),
            _ => format!("Purged dead letter #{position}."),
        }
    };
    log::info!(
        target: "outbox_admin",
        "{} by an operator from {}",
        text_done.trim_end_matches('.'),
        request.peer_or_unknown()
    );
    Ok(done(admin.base_path(), "/dead", &text_done))
}

/// Which form asked for a cancel: it says what the path names and where the operator goes
/// next.
#[derive(Debug, Clone, Copy)]
enum CancelFrom<'a> {
    /// A message's page: every pending row of the message in the path.
    Message(&'a str),
    /// The subscriptions page: the pending deliveries to the subscription in the path.
    Subscription(&'a str),
    /// The pending page filtered by type: the form's `type` (and `older_than_seconds`).
    Pending,
    /// `POST /api/cancel`: the form's `message_id`, `type`, `subscription`,
    /// `older_than_seconds`, answered in JSON.
    Api,
}

/// Cancels pending messages ([`admin::cancel`]) with the form's `reason`; the selection comes
/// from the path and the form as `from` says. Each surface asks the same function, so a
/// cancel means the same from a page, the JSON API and the CLI.
fn cancel<M>(admin: &Admin<M>, request: &Request, from: CancelFrom<'_>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let api = matches!(from, CancelFrom::Api);
    let base = admin.base_path();
    let form = request.form();
    let decoded = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (message_id, subscription_id, back) = match from {
        CancelFrom::Message(id) => (Some(decoded(id)), None, "/messages".to_owned()),
        CancelFrom::Subscription(id) => (None, Some(decoded(id)), "/subscriptions".to_owned()),
        CancelFrom::Pending => (None, None, pending_path(form.get("type"))),
        CancelFrom::Api => (
            form.get("message_id").map(str::to_owned),
            form.get("subscription").map(str::to_owned),
            String::new(),
        ),
    };
    let mut selection = CancelSelection::new();
    if let Some(id) = message_id {
        let Ok(id) = id.parse::<MessageId>() else {
            return Ok(bad_request(
                base,
                api,
                &format!("`{id}` is not a message id (a UUID)"),
            ));
        };
        selection = selection.message_id(id);
    }
    if let Some(id) = subscription_id {
        selection = selection.subscription(id);
    }
    if matches!(from, CancelFrom::Pending | CancelFrom::Api) {
        if let Some(message_type) = form.get("type") {
            selection = selection.message_type(message_type);
        }
        if let Some(seconds) = form.get("older_than_seconds") {
            let Ok(seconds) = seconds.parse::<u64>() else {
                return Ok(bad_request(
                    base,
                    api,
                    "older_than_seconds must be a whole number of seconds",
                ));
            };
            selection = selection.older_than(std::time::Duration::from_secs(seconds));
        }
    }
    let reason = form.get("reason").unwrap_or_default();
    let cancelled = match admin::cancel(&mut *connection(admin)?, &selection, reason) {
        Ok(cancelled) => cancelled,
        Err(error @ outbox_diesel::Error::InvalidCancel { .. }) => {
            return Ok(bad_request(base, api, &error.to_string()))
        }
        Err(error) => return Err(error.to_string()),
    };
    log::info!(
        target: "outbox_admin",
        "{} cancelled, {} being delivered left alone ({selection:?}, reason: {reason}) by an \
         operator from {}",
        cancelled.cancelled,
        cancelled.in_flight,
        request.peer_or_unknown()
    );
    if api {
        return Ok(Response::json(200, &json!(cancelled)));
    }
    Ok(done(base, &back, &pages::cancelled(cancelled, reason)))
}

/// The target a replay's or a resend's form names: `destination`, or `subscription`.
fn replay_target(form: &Params) -> Result<ReplayTarget, &'static str> {
    match (form.get("destination"), form.get("subscription")) {
        (Some(name), None) => Ok(ReplayTarget::Destination(name.to_owned())),
        (None, Some(id)) => Ok(ReplayTarget::Subscription(id.to_owned())),
        _ => Err("name either a destination or a subscription to send to"),
    }
}

/// The deliveries page of a replay's or a resend's target.
fn deliveries_of(target: &ReplayTarget) -> String {
    let (name, value) = match target {
        ReplayTarget::Destination(name) => ("destination", name),
        ReplayTarget::Subscription(id) => ("subscription", id),
    };
    let encoded: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
    format!("/deliveries?{name}={encoded}")
}

/// A replay from the Deliveries page or the API: `destination` or `subscription`, `since`,
/// `until` (RFC 3339 or an age, `1h`) and `type`.
fn replay<M>(admin: &Admin<M>, request: &Request, api: bool) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let base = admin.base_path();
    let form = request.form();
    let target = match replay_target(&form) {
        Ok(target) => target,
        Err(problem) => return Ok(bad_request(base, api, problem)),
    };
    let Some(since) = form.get("since") else {
        return Ok(bad_request(
            base,
            api,
            "give `since`: RFC 3339 or an age (1h)",
        ));
    };
    let since = match delivery_log::parse_time(since) {
        Ok(since) => since,
        Err(problem) => return Ok(bad_request(base, api, &problem)),
    };
    let mut replay = Replay::new(target, since);
    if let Some(until) = form.get("until") {
        match delivery_log::parse_time(until) {
            Ok(until) => replay.until = Some(until),
            Err(problem) => return Ok(bad_request(base, api, &problem)),
        }
    }
    replay.message_type = form.get("type").map(str::to_owned);
    let replayed = match delivery_log::replay(&mut *connection(admin)?, &replay) {
        Ok(replayed) => replayed,
        Err(error @ outbox_diesel::Error::InvalidReplay { .. }) => {
            return Ok(bad_request(base, api, &error.to_string()))
        }
        Err(error) => return Err(error.to_string()),
    };
    log::info!(
        target: "outbox_admin",
        "replayed {} archived messages ({replay:?}) by an operator from {}",
        replayed.enqueued,
        request.peer_or_unknown()
    );
    if api {
        return Ok(Response::json(200, &json!(replayed)));
    }
    Ok(done(
        base,
        &deliveries_of(&replay.target),
        &pages::replayed(&replay.target, replayed),
    ))
}

/// A resend from a message's page (`id`) or the API (`message_id`): `destination` or
/// `subscription`.
fn resend<M>(admin: &Admin<M>, request: &Request, id: Option<&str>) -> Outcome
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let api = id.is_none();
    let base = admin.base_path();
    let form = request.form();
    let id = match id {
        Some(id) => percent_encoding::percent_decode_str(id)
            .decode_utf8_lossy()
            .into_owned(),
        None => form.get("message_id").unwrap_or_default().to_owned(),
    };
    let Ok(message_id) = id.parse::<MessageId>() else {
        return Ok(bad_request(
            base,
            api,
            &format!("`{id}` is not a message id (a UUID)"),
        ));
    };
    let target = match replay_target(&form) {
        Ok(target) => target,
        Err(problem) => return Ok(bad_request(base, api, problem)),
    };
    let sent = match delivery_log::resend(&mut *connection(admin)?, message_id, &target) {
        Ok(sent) => sent,
        Err(error @ outbox_diesel::Error::InvalidReplay { .. }) => {
            return Ok(bad_request(base, api, &error.to_string()))
        }
        Err(error) => return Err(error.to_string()),
    };
    log::info!(
        target: "outbox_admin",
        "resent message {message_id} to {target:?} by an operator from {}",
        request.peer_or_unknown()
    );
    if api {
        return Ok(Response::json(200, &json!(sent)));
    }
    Ok(done(
        base,
        &format!("/messages/{message_id}"),
        &pages::replayed(&target, sent),
    ))
}

/// The pending page, filtered by `message_type` if there is one.
fn pending_path(message_type: Option<&str>) -> String {
    match message_type {
        Some(message_type) => {
            let encoded: String =
                form_urlencoded::byte_serialize(message_type.as_bytes()).collect();
            format!("/messages?type={encoded}")
        }
        None => "/messages".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_of_this_site_are_followed_after_sign_in() {
        assert_eq!(safe_next("/outbox", Some("/receiver")), "/receiver");
        assert_eq!(
            safe_next("/outbox", Some("/outbox/dead?type=a")),
            "/outbox/dead?type=a"
        );
        for hostile in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil.example",
            "evil",
            "/a\r\nSet-Cookie: x=1",
        ] {
            assert_eq!(safe_next("/outbox", Some(hostile)), "/outbox/", "{hostile}");
        }
        assert_eq!(safe_next("/ops", None), "/ops/");
    }

    #[test]
    fn a_page_fetched_with_one_extra_row_knows_whether_more_follow() {
        let full: Vec<i64> = (1..=i64::from(PAGE) + 1).collect();
        let (rows, next) = paged(full, |p| *p);
        assert_eq!(rows.len(), PAGE as usize);
        assert_eq!(next, Some(i64::from(PAGE)));
        let (rows, next) = paged(vec![3, 9], |p| *p);
        assert_eq!((rows, next), (vec![3, 9], None));
    }

    #[test]
    fn filters_are_read_from_the_query_and_nonsense_is_refused() {
        let query = Request::new("GET", "/?type=a&key=k&min_attempts=2&due=1&after=40").query();
        let options = format!("{:?}", list_options(&query).unwrap());
        for part in [
            "message_type: Some(\"a\")",
            "ordering_key: Some(\"k\")",
            "min_attempts: 2",
            "due_only: true",
            "after: Some(40)",
            "limit: 51",
        ] {
            assert!(options.contains(part), "{part} in {options}");
        }
        let bad = Request::new("GET", "/?min_attempts=many").query();
        assert!(list_options(&bad).unwrap_err().contains("min_attempts"));
        let bad = Request::new("GET", "/?after=-x").query();
        assert!(list_options(&bad).unwrap_err().contains("after"));
    }

    #[test]
    fn a_flash_cookie_round_trips_any_text() {
        let cookie = flash_cookie("/outbox", "Re-queued 3 dead letters of type a;b=c.", 60);
        let value = cookie
            .split("; ")
            .next()
            .unwrap()
            .trim_start_matches("outbox_admin_flash=");
        assert!(!value.contains(';') && !value.contains(' '), "{value}");
        let request = Request::new("GET", "/").header("cookie", &format!("{FLASH}={value}"));
        assert_eq!(
            read_flash(&request).as_deref(),
            Some("Re-queued 3 dead letters of type a;b=c.")
        );
        let cleared = Request::new("GET", "/").header("cookie", &format!("{FLASH}="));
        assert_eq!(read_flash(&cleared), None);
    }
}
