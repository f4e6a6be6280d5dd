//! The HTML: server-rendered, no script, every text from the database escaped.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use outbox_diesel::admin::{
    BlockedKey, Cancelled, DeadLetter, DestinationStatus, FoundMessage, Pause, PauseKind,
    PendingMessage, TypeStats,
};
use outbox_diesel::delivery_log::{LoggedAttempt, ReplayTarget, Replayed};
use outbox_diesel::subscription::SubscriptionInfo;
use outbox_diesel::Headers;

use crate::chart::{sparkline, Sample};
use crate::http::Params;

/// What every page shows around its content: the mount point its links start from, and the
/// outcome of the action that led to it, shown once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page<'a> {
    pub base: &'a str,
    pub flash: Option<&'a str>,
}

/// Text made safe for HTML content and attribute values; control characters (but newlines
/// and tabs) and bidirectional overrides, which could disguise an error text, are shown as
/// `\u{…}` escapes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control()
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// "1 dead letter", "2 dead letters".
pub(crate) fn dead_letters(count: usize) -> String {
    if count == 1 {
        "1 dead letter".to_owned()
    } else {
        format!("{count} dead letters")
    }
}

/// A query string value.
fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

const STYLE: &str = "
body{font:15px/1.5 system-ui,sans-serif;max-width:72rem;margin:0 auto;padding:1rem 1.5rem;color:#1d2330;background:#fbfbfd}
nav{display:flex;gap:1.25rem;align-items:center;border-bottom:1px solid #dde;padding-bottom:.5rem;margin-bottom:1rem}
nav a{color:#3450a1;text-decoration:none;font-weight:600} nav form{margin-left:auto}
h1{font-size:1.5rem;margin:.5rem 0} h2{font-size:1.15rem;margin-top:1.75rem}
a{color:#3450a1}
.notice{background:#e8f4ea;border:1px solid #9cc9a5;padding:.5rem .75rem;border-radius:6px}
.error{background:#fbeaea;border:1px solid #e3a1a1;padding:.5rem .75rem;border-radius:6px}
.warning{background:#fff4d6;border:1px solid #e0c36a;padding:.5rem .75rem;border-radius:6px}
.meta{color:#667;font-size:.85rem}
form.stack{display:grid;gap:.5rem;max-width:32rem}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin:.5rem 0 1rem}
form.filters label{display:grid;font-size:.8rem;color:#556}
input,select{font:inherit;padding:.3rem .4rem;border:1px solid #bbc;border-radius:4px}
button{font:inherit;padding:.3rem .75rem;border:1px solid #3450a1;background:#3450a1;color:#fff;border-radius:4px;cursor:pointer}
button.quiet{background:#fff;color:#3450a1} button.danger{background:#a13434;border-color:#a13434}
table{border-collapse:collapse;width:100%;font-size:.875rem} td,th{border-bottom:1px solid #e3e3ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
td pre,pre.block{margin:0;white-space:pre-wrap;word-break:break-all}
td pre{max-width:28rem;max-height:6rem;overflow:auto}
pre.block{background:#fff;border:1px solid #dde;border-radius:6px;padding:.75rem;max-height:30rem;overflow:auto}
.figures{display:flex;flex-wrap:wrap;gap:1rem}
.figure{background:#fff;border:1px solid #dde;border-radius:6px;padding:.5rem 1rem;min-width:10rem}
.figure b{display:block;font-size:1.4rem}
svg.spark{display:block;margin-top:.25rem} svg.spark polyline{fill:none;stroke:#3450a1;stroke-width:1.5} svg.spark .axis{stroke:#dde}
.state{font-size:.8rem;padding:.05rem .4rem;border-radius:4px;background:#eef}
.state.dead{background:#fbeaea} .state.flight{background:#fff4d6}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem} dl.fields dt{color:#556}
form.inline{display:inline}
";

fn layout(page: Page<'_>, title: &str, body: &str, refresh: Option<Duration>) -> String {
    let base = escape(page.base);
    let refresh = match refresh {
        Some(every) if !every.is_zero() => format!(
            "<meta http-equiv=\"refresh\" content=\"{}\">",
            every.as_secs().max(1)
        ),
        _ => String::new(),
    };
    let flash = page
        .flash
        .map(|text| format!("<p class=\"notice\" id=\"notice\">{}</p>", escape(text)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">{refresh}\
         <title>{title} · outbox</title><style>{STYLE}</style></head><body>\
         <nav><a href=\"{base}/\">Overview</a><a href=\"{base}/messages\">Pending</a>\
         <a href=\"{base}/dead\">Dead letters</a><a href=\"{base}/deliveries\">Deliveries</a>\
         <a href=\"{base}/subscriptions\">Subscriptions</a>\
         <form method=\"get\" action=\"{base}/find\"><input name=\"id\" placeholder=\"message id\" \
         aria-label=\"message id\" size=\"38\"> <button class=\"quiet\">Find</button></form>\
         <form method=\"post\" action=\"{base}/logout\"><button class=\"quiet\" id=\"sign-out\">\
         Sign out</button></form></nav>{flash}{body}</body></html>",
        title = escape(title),
    )
}

/// A page for a problem: a bad request, a missing page, a database error.
pub(crate) fn problem(base: &str, text: &str) -> String {
    let page = Page { base, flash: None };
    layout(
        page,
        "Problem",
        &format!("<p class=\"error\" id=\"problem\">{}</p>", escape(text)),
        None,
    )
}

pub(crate) fn login(base: &str, next: &str, error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>", escape(e)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>Sign in · outbox</title><style>{STYLE}</style></head><body>\
         <h1>Outbox admin</h1>{error}<p>Sign in with the admin token.</p>\
         <form class=\"stack\" method=\"post\" action=\"{base}/login\">\
         <input type=\"hidden\" name=\"next\" value=\"{next}\">\
         <input name=\"token\" id=\"token\" type=\"password\" placeholder=\"admin token\" \
         autocomplete=\"current-password\" required>\
         <button id=\"login\">Sign in</button></form></body></html>",
        base = escape(base),
        next = escape(next),
    )
}

/// How long ago (or how far ahead) `time` is, with the exact time on hover.
fn when(time: SystemTime) -> String {
    let now = SystemTime::now();
    let (seconds, future) = match time.duration_since(now) {
        Ok(ahead) => (ahead.as_secs(), true),
        Err(behind) => (behind.duration().as_secs(), false),
    };
    let span = match seconds {
        0..=59 => format!("{seconds}s"),
        60..=3599 => format!("{}m", seconds / 60),
        3600..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    };
    let text = if seconds == 0 {
        "now".to_owned()
    } else if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    };
    format!(
        "<time title=\"{}\">{text}</time>",
        httpdate::fmt_http_date(time)
    )
}

fn age(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// The overview's figures.
#[derive(Debug)]
pub(crate) struct Overview {
    pub pending: u64,
    pub in_flight: u64,
    pub dead: u64,
    pub oldest_due_age: Duration,
    /// How long the oldest transaction holding back the database's clean-up has been open.
    pub oldest_transaction_age: Option<Duration>,
    /// That age when it is long enough to warn about.
    pub long_transaction: Option<Duration>,
    /// Rows the database cannot clean up yet.
    pub dead_rows: Option<u64>,
    pub settled_per_second: Option<f64>,
    pub has_worker: bool,
    pub samples: Vec<Sample>,
    pub rates: Vec<Option<f64>>,
    pub stats: Vec<TypeStats>,
    pub blocked: Vec<BlockedKey>,
    /// The destinations the workers report.
    pub destinations: Vec<DestinationStatus>,
    /// What operators paused.
    pub pauses: Vec<Pause>,
    pub refresh: Duration,
}

impl Overview {
    /// The pause of `name` of `kind`, if it is paused.
    fn pause(&self, kind: PauseKind, name: &str) -> Option<&Pause> {
        self.pauses
            .iter()
            .find(|p| p.kind == kind && p.name == name)
    }
}

/// A button that pauses (or, when `paused`, resumes) message type or destination `name`:
/// `path` is `types` or `destinations`.
fn pause_button(base: &str, path: &str, name: &str, paused: bool) -> String {
    let (action, label) = if paused {
        ("resume", "Resume")
    } else {
        ("pause", "Pause")
    };
    let class = if path == "types" {
        "type"
    } else {
        "destination"
    };
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{base}/{path}/{}/{action}\">\
         <button class=\"quiet {action}-{class}\">{label}</button></form>",
        percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
    )
}

/// Every pause, with a button to resume each (types without messages and destinations no
/// worker reported included).
fn paused_section(base: &str, pauses: &[Pause]) -> String {
    if pauses.is_empty() {
        return String::new();
    }
    let mut section = "<h2>Paused</h2><p class=\"meta\">No worker handles a paused message type \
         or delivers to a paused destination; their messages stay pending without spending \
         attempts. The workers follow a pause or a resume within a few seconds.</p>\
         <table id=\"paused\"><tr><th>kind</th><th>name</th><th>since</th><th>reason</th>\
         <th></th></tr>"
        .to_owned();
    for p in pauses {
        let path = if p.kind == PauseKind::Destination {
            "destinations"
        } else {
            "types"
        };
        let _ = write!(
            section,
            "<tr class=\"pause\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            p.kind.as_str(),
            escape(&p.name),
            when(p.paused_at),
            escape(&p.reason),
            pause_button(base, path, &p.name, true),
        );
    }
    section.push_str("</table>");
    section
}

/// A transaction open long enough to keep the database from cleaning up the outbox table.
fn long_transaction_warning(o: &Overview) -> String {
    let Some(open) = o.long_transaction else {
        return String::new();
    };
    let rows = o
        .dead_rows
        .map_or_else(String::new, |n| format!(" ({n} rows wait for it)"));
    format!(
        "<p class=\"warning\" id=\"long-transaction\">A transaction has been open for {}: \
         until it ends the database cannot clean up what settled messages leave behind{rows}. \
         Claims stay fast, but the table and its indexes grow.</p>",
        age(open)
    )
}

pub(crate) fn overview(page: Page<'_>, o: &Overview) -> String {
    let base = escape(page.base);
    let pending: Vec<f64> = o.samples.iter().map(|s| s.pending as f64).collect();
    let ages: Vec<f64> = o
        .samples
        .iter()
        .map(|s| s.oldest_due_age.as_secs_f64())
        .collect();
    let rates: Vec<f64> = o.rates.iter().map(|r| r.unwrap_or(0.0)).collect();
    let rate = match (o.has_worker, o.settled_per_second) {
        (false, _) => "<b id=\"settled-rate\">–</b>settled/s (no worker attached)".to_owned(),
        (true, None) => "<b id=\"settled-rate\">…</b>settled/s (measuring)".to_owned(),
        (true, Some(rate)) => format!("<b id=\"settled-rate\">{rate:.1}</b>settled/s"),
    };
    let refresh = if o.refresh.is_zero() {
        String::new()
    } else {
        format!(" · reloads every {} s", o.refresh.as_secs().max(1))
    };
    let mut body = format!(
        "<h1>Outbox</h1><p class=\"meta\">Charts: {} sample(s), at most one per 5 s, \
         taken while these pages are read{refresh}.</p><div class=\"figures\">\
         <div class=\"figure\"><b id=\"pending-count\">{}</b>pending{}</div>\
         <div class=\"figure\"><b id=\"oldest-age\">{}</b>oldest due waits{}</div>\
         <div class=\"figure\">{rate}{}</div>\
         <div class=\"figure\"><b id=\"in-flight-count\">{}</b>in flight</div>\
         <div class=\"figure\"><b id=\"dead-count\">{}</b><a href=\"{base}/dead\">dead</a></div>\
         </div>{}{}<h2>By type</h2><table id=\"types\"><tr><th>type</th><th>pending</th>\
         <th>in flight</th><th>dead</th><th>oldest enqueued</th><th></th></tr>",
        o.samples.len(),
        o.pending,
        sparkline("pending messages over time", &pending),
        age(o.oldest_due_age),
        sparkline("oldest due message's wait over time", &ages),
        sparkline("settled per second over time", &rates),
        o.in_flight,
        o.dead,
        long_transaction_warning(o),
        paused_section(&base, &o.pauses),
    );
    for s in &o.stats {
        let t = encode(&s.message_type);
        let paused = o.pause(PauseKind::MessageType, &s.message_type).is_some();
        let badge = if paused {
            " <span class=\"state dead\">paused</span>"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<tr class=\"type\"><td>{}{badge}</td><td><a href=\"{base}/messages?type={t}\">{}</a></td>\
             <td>{}</td><td><a href=\"{base}/dead?type={t}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            escape(&s.message_type),
            s.pending - s.in_flight.min(s.pending),
            s.in_flight,
            s.dead,
            s.oldest_pending.map(when).unwrap_or_default(),
            pause_button(&base, "types", &s.message_type, paused),
        );
    }
    if o.stats.is_empty() {
        body.push_str("<tr><td colspan=\"6\">The outbox is empty.</td></tr>");
    }
    body.push_str(
        "</table><h2>Blocked ordering keys</h2><p class=\"meta\">Keys whose first message \
         failed and waits for a retry: the messages behind it wait too.</p>\
         <table id=\"blocked\"><tr><th>key</th><th>head</th><th>type</th><th>attempts</th>\
         <th>next attempt</th><th>waiting behind</th><th>last error</th></tr>",
    );
    for b in &o.blocked {
        let _ = write!(
            body,
            "<tr class=\"blocked-key\"><td><a href=\"{base}/messages?key={key_q}\">{key}</a></td>\
             <td><a href=\"{base}/messages/{id}\">#{position}</a></td><td>{t}</td>\
             <td>{attempts}</td><td>{next}</td><td>{waiting}</td><td><pre>{error}</pre></td></tr>",
            key_q = encode(&b.ordering_key),
            key = escape(&b.ordering_key),
            id = b.message_id,
            position = b.position,
            t = escape(&b.message_type),
            attempts = b.attempts,
            next = when(b.next_attempt_at),
            waiting = b.waiting,
            error = escape(&b.last_error),
        );
    }
    if o.blocked.is_empty() {
        body.push_str("<tr><td colspan=\"7\">No key is blocked.</td></tr>");
    }
    body.push_str("</table>");
    if !o.destinations.is_empty() {
        body.push_str(&destinations(&base, &o.destinations, &o.pauses));
    }
    layout(page, "Overview", &body, Some(o.refresh))
}

/// The destinations' health as the workers report it, with a button to enable one that is
/// not healthy.
fn destinations(base: &str, destinations: &[DestinationStatus], pauses: &[Pause]) -> String {
    let mut table = "<h2>Destinations</h2><p class=\"meta\">Held: it asked for no deliveries for \
         a while. Paused: failing again and again; its messages wait without spending attempts \
         until a probe gets an answer. Disabled: it said it is gone (410 Gone) or an operator \
         disabled it; its messages are dead-lettered until it is enabled. Pause one to keep its \
         messages pending, without spending attempts, until you resume it. The workers report \
         every few seconds and follow an enable, a pause or a resume as fast.</p>\
         <table id=\"destinations\"><tr><th>destination</th><th>kind</th><th>state</th>\
         <th>consecutive failures</th><th>details</th><th>reported</th><th></th></tr>"
        .to_owned();
    for e in destinations {
        let details = match (&e.disabled_reason, &e.last_error, e.next_probe_at) {
            (Some(reason), _, _) => escape(reason),
            (None, Some(error), Some(probe)) => format!(
                "next probe {}; last failure: {}",
                when(probe),
                escape(error)
            ),
            (None, Some(error), None) => format!("last failure: {}", escape(error)),
            (None, None, _) => String::new(),
        };
        let healthy = e.state == "healthy";
        let enable = if healthy {
            String::new()
        } else {
            format!(
                "<form class=\"inline\" method=\"post\" action=\"{base}/destinations/{}/enable\">\
                 <button class=\"quiet enable-destination\">Enable</button></form>",
                percent_encoding::utf8_percent_encode(&e.name, percent_encoding::NON_ALPHANUMERIC)
            )
        };
        let paused = pauses
            .iter()
            .any(|p| p.kind == PauseKind::Destination && p.name == e.name);
        let enable = enable + &pause_button(base, "destinations", &e.name, paused);
        let _ = write!(
            table,
            "<tr class=\"destination\"><td><a href=\"{base}/deliveries?destination={}\">{}</a>\
             </td><td>{}</td><td><span class=\"state {class}\">{}</span></td>\
             <td>{}</td><td>{details}</td><td>{}</td><td>{enable}</td></tr>",
            encode(&e.name),
            escape(&e.name),
            escape(&e.kind),
            escape(&e.state),
            e.consecutive_failures,
            when(e.reported_at),
            class = if healthy { "" } else { "dead" },
        );
    }
    table.push_str("</table>");
    table
}

/// The subscriptions, with their actions, and a form to add one (when the pages may make
/// secrets).
pub(crate) fn subscriptions(page: Page<'_>, listed: &[SubscriptionInfo], can_add: bool) -> String {
    let base = escape(page.base);
    let mut body = String::from(
        "<h1>Subscriptions</h1><p class=\"meta\">Endpoints the application's customers add. \
         Each takes the events it asks for, delivered and retried on its own, and is a \
         destination of its own on the overview (<code>subscription:&lt;id&gt;</code>). A \
         disabled one gets no new events, and its waiting deliveries pause until it is enabled. \
         Secrets are shown once, when made.</p>\
         <table id=\"subscriptions\"><tr><th>id</th><th>owner</th><th>state</th>\
         <th>event types</th><th>url</th><th>created</th><th></th></tr>",
    );
    for s in listed {
        let id = percent_encoding::utf8_percent_encode(&s.id, percent_encoding::NON_ALPHANUMERIC);
        let (state, switch) = if s.enabled {
            ("enabled", "disable")
        } else {
            ("disabled", "enable")
        };
        let button = |action: &str, label: &str| {
            format!(
                "<form class=\"inline\" method=\"post\" action=\"{base}/subscriptions/{id}/{action}\">\
                 <button class=\"quiet {action}-subscription\">{label}</button></form>"
            )
        };
        let mut actions = button(switch, if s.enabled { "Disable" } else { "Enable" });
        if can_add {
            actions.push_str(&button("rotate-secret", "Rotate secret"));
        }
        actions.push_str(&button("remove", "Remove"));
        actions.push_str(&cancel_form(
            &format!("{base}/subscriptions/{id}/cancel"),
            "cancel-deliveries",
            "Cancel waiting deliveries",
        ));
        let _ = write!(
            body,
            "<tr class=\"subscription\"><td><code>{}</code></td><td>{}</td>\
             <td><span class=\"state {class}\">{state}</span></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{actions}</td></tr>",
            escape(&s.id),
            escape(s.owner.as_deref().unwrap_or("-")),
            escape(&s.event_types.join(", ")),
            escape(&s.url),
            when(s.created_at),
            class = if s.enabled { "" } else { "dead" },
        );
    }
    body.push_str("</table>");
    if can_add {
        let _ = write!(
            body,
            "<h2>Add a subscription</h2><form class=\"stack\" method=\"post\" \
             action=\"{base}/subscriptions\">\
             <input name=\"url\" id=\"subscription-url\" placeholder=\"https://receiver.example/hooks\" \
             required><input name=\"event_types\" id=\"subscription-types\" \
             placeholder=\"event types: invoice.*, order.paid\" required>\
             <input name=\"owner\" placeholder=\"owner (optional)\">\
             <input name=\"description\" placeholder=\"description (optional)\">\
             <label><input type=\"checkbox\" name=\"allow_http\" value=\"1\"> allow http://</label>\
             <button id=\"add-subscription\">Add</button></form>"
        );
    }
    layout(page, "Subscriptions", &body, None)
}

/// A secret just made: shown this once.
pub(crate) fn secret_once(page: Page<'_>, id: &str, secret: &str, what: &str) -> String {
    let base = escape(page.base);
    let body = format!(
        "<h1>Subscription {what}</h1><p>Subscription <code>{}</code>. Its signing secret, shown \
         this once (give it to the subscriber now):</p><p><code id=\"secret\">{}</code></p>\
         <p><a href=\"{base}/subscriptions\">Back to the subscriptions</a></p>",
        escape(id),
        escape(secret)
    );
    layout(page, "Subscription", &body, None)
}

/// A filter form's text field, keeping what was asked.
fn field(query: &Params, name: &str, label: &str, size: u32) -> String {
    format!(
        "<label>{label}<input name=\"{name}\" id=\"filter-{name}\" size=\"{size}\" value=\"{}\"></label>",
        escape(query.get(name).unwrap_or_default())
    )
}

/// The link to the next page: the same filters, after the last position shown.
fn next_link(base: &str, path: &str, query: &Params, names: &[&str], after: Option<i64>) -> String {
    paged_link(base, path, query, names, ("after", after))
}

/// The link to the next page: the same filters, and `cursor` (a parameter and its value).
fn paged_link(
    base: &str,
    path: &str,
    query: &Params,
    names: &[&str],
    cursor: (&str, Option<i64>),
) -> String {
    let (cursor, Some(at)) = cursor else {
        return "<p class=\"meta\">End of the list.</p>".to_owned();
    };
    let mut href = format!("{base}{path}?{cursor}={at}");
    for name in names {
        if let Some(value) = query.get(name) {
            let _ = write!(href, "&{name}={}", encode(value));
        }
    }
    format!(
        "<p><a id=\"next-page\" href=\"{}\">Next page →</a></p>",
        escape(&href)
    )
}

pub(crate) struct PendingPage<'a> {
    pub query: &'a Params,
    pub messages: &'a [PendingMessage],
    pub next_after: Option<i64>,
}

/// When a pending message is tried next: a paused one when it is resumed.
fn next_attempt(m: &PendingMessage) -> String {
    if m.paused {
        "when resumed".to_owned()
    } else {
        when(m.next_attempt_at)
    }
}

fn state_of(m: &PendingMessage) -> &'static str {
    if m.in_flight {
        "<span class=\"state flight\">in flight</span>"
    } else if m.paused {
        "<span class=\"state dead\">paused</span>"
    } else if m.parked {
        "<span class=\"state\">behind its key</span>"
    } else if m.next_attempt_at <= SystemTime::now() {
        "<span class=\"state\">due</span>"
    } else if m.attempts > 0 {
        "<span class=\"state\">retrying</span>"
    } else {
        "<span class=\"state\">delayed</span>"
    }
}

/// At most `max` characters of `text`, marked when cut.
fn short(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A payload as listed: its first characters, marked when there is more.
fn preview(payload: &str, truncated: bool) -> String {
    if truncated {
        format!("{payload}…")
    } else {
        payload.to_owned()
    }
}

pub(crate) fn pending(page: Page<'_>, p: &PendingPage<'_>) -> String {
    let base = escape(page.base);
    let due_checked = if p.query.get("due").is_some_and(|d| d != "0") {
        " checked"
    } else {
        ""
    };
    let mut body = format!(
        "<h1>Pending messages</h1><form class=\"filters\" method=\"get\" \
         action=\"{base}/messages\">{}{}{}<label>due now<input type=\"checkbox\" name=\"due\" \
         value=\"1\" id=\"filter-due\"{due_checked}></label><button id=\"filter\">Filter</button> \
         <a href=\"{base}/messages\">clear</a></form>\
         <table id=\"pending\"><tr><th>#</th><th>type</th><th>key</th><th>state</th>\
         <th>attempts</th><th>enqueued</th><th>next attempt</th><th>last error</th></tr>",
        field(p.query, "type", "type", 18),
        field(p.query, "key", "ordering key", 14),
        field(p.query, "min_attempts", "attempts ≥", 4),
    );
    for m in p.messages {
        let _ = write!(
            body,
            "<tr class=\"pending-message\"><td><a href=\"{base}/messages/{id}\">#{position}</a></td>\
             <td>{t}</td><td>{key}</td><td>{state}</td><td>{attempts}</td><td>{created}</td>\
             <td>{next}</td><td><pre>{error}</pre></td></tr>",
            id = m.message_id,
            position = m.position,
            t = escape(&m.message_type),
            key = escape(m.ordering_key.as_deref().unwrap_or("")),
            state = state_of(m),
            attempts = m.attempts,
            created = when(m.created_at),
            next = next_attempt(m),
            error = escape(&short(m.last_error.as_deref().unwrap_or(""), 300)),
        );
    }
    if p.messages.is_empty() {
        body.push_str("<tr><td colspan=\"8\">No message matches.</td></tr>");
    }
    body.push_str("</table>");
    if let Some(message_type) = p.query.get("type") {
        let _ = write!(
            body,
            "<div id=\"cancel-type\">Cancel every waiting message of type <code>{t}</code> (not only this page): \
             <form class=\"inline\" method=\"post\" action=\"{base}/messages/cancel\">\
             <input type=\"hidden\" name=\"type\" value=\"{t}\">\
             <input name=\"reason\" class=\"cancel-reason\" placeholder=\"reason (kept)\" \
             size=\"18\" required> <button class=\"danger cancel-type\">Cancel all</button>\
             </form></div>",
            t = escape(message_type),
        );
    }
    body.push_str(&next_link(
        page.base,
        "/messages",
        p.query,
        &["type", "key", "min_attempts", "due"],
        p.next_after,
    ));
    layout(page, "Pending", &body, None)
}

/// The payload as indented JSON when it is JSON, as stored otherwise.
fn pretty(payload: &str) -> String {
    serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| payload.to_owned())
}

fn headers_table(headers: &Headers) -> String {
    if headers.is_empty() {
        return "<p class=\"meta\" id=\"message-headers\">No headers.</p>".to_owned();
    }
    let mut table = "<table id=\"message-headers\"><tr><th>name</th><th>value</th></tr>".to_owned();
    for (name, value) in headers.iter() {
        let _ = write!(
            table,
            "<tr><td>{}</td><td><code>{}</code></td></tr>",
            escape(name),
            escape(value)
        );
    }
    table.push_str("</table>");
    table
}

/// A form that cancels what `action` names, asking for the reason kept with each message.
fn cancel_form(action: &str, id: &str, label: &str) -> String {
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{action}\">\
         <input name=\"reason\" class=\"cancel-reason\" placeholder=\"reason (kept)\" size=\"18\" \
         required> <button class=\"danger {id}\">{label}</button></form>"
    )
}

/// What a cancel did, for the page it returns to.
pub(crate) fn cancelled(cancelled: Cancelled, reason: &str) -> String {
    let mut text = match cancelled.cancelled {
        0 => "Nothing was cancelled: no waiting message matched.".to_owned(),
        1 => format!("Cancelled 1 message ({reason})."),
        n => format!("Cancelled {n} messages ({reason})."),
    };
    match cancelled.in_flight {
        0 => {}
        1 => text.push_str(
            " 1 was being delivered and was left alone: it finishes, or a second cancel takes \
             it before its next attempt.",
        ),
        n => {
            let _ = write!(
                text,
                " {n} were being delivered and were left alone: they finish, or a second cancel \
                 takes them before their next attempt."
            );
        }
    }
    text
}

fn dead_actions(base: &str, position: i64) -> String {
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{base}/dead/{position}/requeue\">\
         <button class=\"requeue\">Re-queue</button></form> \
         <form class=\"inline\" method=\"post\" action=\"{base}/dead/{position}/purge\">\
         <button class=\"danger purge\">Purge</button></form>"
    )
}

/// Exchanges from the delivery log, newest first; with a link to each one's message when
/// `with_message`.
fn attempts_table(base: &str, attempts: &[LoggedAttempt], with_message: bool) -> String {
    if attempts.is_empty() {
        return "<p class=\"meta\" id=\"no-attempts\">No exchange with a destination is \
                logged for this.</p>"
            .to_owned();
    }
    let message_header = if with_message {
        "<th>message</th><th>type</th>"
    } else {
        ""
    };
    let mut table = format!(
        "<table id=\"attempts\"><tr><th>started</th>{message_header}<th>destination</th>\
         <th>attempt</th><th>outcome</th><th>status</th><th>ms</th><th>answer</th><th>error</th></tr>"
    );
    for a in attempts {
        let message = if with_message {
            format!(
                "<td><a href=\"{base}/messages/{id}\"><code>{id}</code></a></td><td>{}</td>",
                escape(&a.message_type),
                id = a.message_id,
            )
        } else {
            String::new()
        };
        let _ = write!(
            table,
            "<tr class=\"attempt\" data-id=\"{}\"><td>{}</td>{message}\
             <td><a href=\"{base}/deliveries?destination={}\">{}</a></td><td>{}</td>\
             <td><span class=\"state {class}\">{}</span></td><td class=\"status\">{}</td>\
             <td>{:.0}</td><td class=\"answer\">{}</td><td>{}</td></tr>",
            a.id,
            when(a.started_at),
            encode(&a.destination),
            escape(&a.destination),
            a.attempt,
            escape(&a.outcome),
            a.status
                .map_or_else(|| "-".to_owned(), |status| status.to_string()),
            a.latency_ms,
            escape(&short(a.answer.as_deref().unwrap_or(""), 200)),
            escape(&short(a.error.as_deref().unwrap_or(""), 200)),
            class = if a.outcome == "delivered" { "" } else { "dead" },
        );
    }
    table.push_str("</table>");
    table
}

/// What a replay or a resend did, as the notice after it says.
pub(crate) fn replayed(target: &ReplayTarget, replayed: Replayed) -> String {
    let to = match target {
        ReplayTarget::Destination(name) => format!("destination {name}"),
        ReplayTarget::Subscription(id) => format!("subscription {id}"),
    };
    let mut text = format!(
        "Enqueued {} deliveries to {to}, with their original ids.",
        replayed.enqueued
    );
    if replayed.skipped > 0 {
        let _ = write!(
            text,
            " {} archived messages in the range are not for it (another owner's, or a type its \
             filters do not take).",
            replayed.skipped
        );
    }
    text
}

/// The form that replays a range to the destination or subscription the page is filtered by.
fn replay_form(base: &str, query: &Params) -> String {
    let target = match (query.get("destination"), query.get("subscription")) {
        (Some(name), None) => ("destination", name),
        (None, Some(id)) => ("subscription", id),
        _ => {
            return "<p class=\"meta\">Filter by a destination or a subscription to replay to \
                    it.</p>"
                .to_owned()
        }
    };
    format!(
        "<form method=\"post\" action=\"{base}/deliveries/replay\" id=\"replay\" class=\"filters\">\
         <input type=\"hidden\" name=\"{}\" value=\"{}\">\
         <b>Replay to {}</b> the archived messages enqueued \
         <label>since <input name=\"since\" id=\"replay-since\" size=\"22\" value=\"1h\" required></label> \
         <label>until <input name=\"until\" id=\"replay-until\" size=\"22\" placeholder=\"now\"></label> \
         <label>of type <input name=\"type\" id=\"replay-type\" size=\"20\" value=\"{}\"></label> \
         <button id=\"replay-button\">Replay</button>\
         <span class=\"meta\"> (RFC 3339 or an age: 1h, 30m; receivers drop what they have by \
         id)</span></form>",
        target.0,
        escape(target.1),
        escape(target.1),
        escape(query.get("type").unwrap_or_default()),
    )
}

/// One button per destination or subscription in a message's log: send it there again.
fn resend_buttons(base: &str, id: &str, attempts: &[LoggedAttempt]) -> String {
    let mut targets: Vec<(&str, &str)> = attempts
        .iter()
        .map(|a| match &a.subscription_id {
            Some(subscription) => ("subscription", subscription.as_str()),
            None => ("destination", a.destination.as_str()),
        })
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
        .iter()
        .map(|(name, value)| {
            format!(
                "<form class=\"inline\" method=\"post\" action=\"{base}/messages/{}/resend\">\
                 <input type=\"hidden\" name=\"{name}\" value=\"{}\">\
                 <button class=\"quiet resend\" title=\"the payload as stored, without the \
                 type's handler\">Resend to {}</button></form> ",
                encode(id),
                escape(value),
                escape(value),
            )
        })
        .collect()
}

/// The delivery log: every exchange with a destination, newest first, filtered.
pub(crate) fn deliveries(
    page: Page<'_>,
    query: &Params,
    attempts: &[LoggedAttempt],
    next_before: Option<i64>,
) -> String {
    let base = escape(page.base);
    let failures = if query.get("failures").is_some_and(|on| on != "0") {
        " checked"
    } else {
        ""
    };
    let body = format!(
        "<h1>Deliveries</h1><p class=\"meta\">Each exchange with a destination, newest first: \
         what it answered, or why it failed. Kept for the store's delivery log retention \
         (7 days and 1,000,000 attempts unless the application chose otherwise).</p>\
         <form method=\"get\" action=\"{base}/deliveries\" class=\"filters\">{}{}{}{}{}\
         <label><input type=\"checkbox\" name=\"failures\" value=\"1\" id=\"filter-failures\"{failures}> \
         failures only</label> <button>Filter</button></form>{}{}{}",
        field(query, "destination", "destination ", 24),
        field(query, "subscription", "subscription ", 24),
        field(query, "type", "type ", 20),
        field(query, "since", "since ", 14),
        field(query, "until", "until ", 14),
        replay_form(&base, query),
        attempts_table(&base, attempts, true),
        paged_link(
            &base,
            "/deliveries",
            query,
            &["destination", "subscription", "type", "failures", "since", "until"],
            ("before", next_before),
        ),
    );
    layout(page, "Deliveries", &body, None)
}

pub(crate) fn message(page: Page<'_>, found: &FoundMessage, attempts: &[LoggedAttempt]) -> String {
    let base = escape(page.base);
    let (fields, payload, headers, actions) = match found {
        FoundMessage::Pending(m) => (
            format!(
                "<dt>state</dt><dd>{}</dd><dt>position</dt><dd>#{}</dd><dt>type</dt><dd>{}</dd>\
                 <dt>ordering key</dt><dd>{}</dd><dt>priority</dt><dd>{}</dd>\
                 <dt>group</dt><dd>{}</dd><dt>attempts</dt><dd>{}</dd>\
                 <dt>enqueued</dt><dd>{}</dd><dt>next attempt</dt><dd>{}</dd>\
                 <dt>last error</dt><dd><pre>{}</pre></dd>",
                state_of(m),
                m.position,
                escape(&m.message_type),
                escape(m.ordering_key.as_deref().unwrap_or("none")),
                m.priority.as_str(),
                escape(m.group.as_deref().unwrap_or("none")),
                m.attempts,
                when(m.created_at),
                next_attempt(m),
                escape(m.last_error.as_deref().unwrap_or("none")),
            ),
            &m.payload,
            &m.headers,
            cancel_form(
                &format!("{base}/messages/{}/cancel", m.message_id),
                "cancel-message",
                "Cancel",
            ),
        ),
        FoundMessage::Dead(d) => (
            format!(
                "<dt>state</dt><dd><span class=\"state dead\">dead letter</span></dd>\
                 <dt>position</dt><dd>#{}</dd><dt>type</dt><dd>{}</dd>\
                 <dt>ordering key</dt><dd>{}</dd><dt>attempts</dt><dd>{}</dd>\
                 <dt>enqueued</dt><dd>{}</dd><dt>failed</dt><dd>{}</dd>\
                 <dt>last error</dt><dd><pre>{}</pre></dd>",
                d.position,
                escape(&d.message_type),
                escape(d.ordering_key.as_deref().unwrap_or("none")),
                d.attempts,
                when(d.created_at),
                when(d.failed_at),
                escape(&d.last_error),
            ),
            &d.payload,
            &d.headers,
            format!("<p>{}</p>", dead_actions(&base, d.position)),
        ),
    };
    let id = match found {
        FoundMessage::Pending(m) => m.message_id,
        FoundMessage::Dead(d) => d.message_id,
    };
    let body = format!(
        "<h1>Message <code id=\"message-id\">{id}</code></h1>{actions}\
         <dl class=\"fields\" id=\"message-fields\">{fields}</dl><h2>Headers</h2>{headers}\
         <h2>Payload</h2><pre class=\"block\" id=\"message-payload\">{payload}</pre>\
         <h2>Delivery log</h2>{attempts}<p>{resend}</p>",
        headers = headers_table(headers),
        payload = escape(&pretty(payload)),
        attempts = attempts_table(&base, attempts, false),
        resend = resend_buttons(&base, &id.to_string(), attempts),
    );
    layout(page, "Message", &body, None)
}

pub(crate) fn not_found_message(page: Page<'_>, id: &str, attempts: &[LoggedAttempt]) -> String {
    let body = if attempts.is_empty() {
        format!(
            "<h1>Message <code>{}</code></h1><p class=\"error\" id=\"problem\">Neither pending \
             nor dead, and nothing in the delivery log: cancelled, purged, delivered before the \
             log's retention, or never enqueued.</p>",
            escape(id)
        )
    } else {
        format!(
            "<h1>Message <code id=\"message-id\">{}</code></h1><p id=\"absent\">No longer in \
             the outbox (delivered, or cancelled). Its exchanges with destinations:</p>\
             <h2>Delivery log</h2>{}<p>{}</p><p class=\"meta\">A resend sends the payload as \
             stored, without the type's handler, and needs the message in the archive (a store \
             that keeps one, within its window).</p>",
            escape(id),
            attempts_table(&escape(page.base), attempts, false),
            resend_buttons(&escape(page.base), id, attempts),
        )
    };
    layout(page, "Message", &body, None)
}

pub(crate) struct DeadPage<'a> {
    pub query: &'a Params,
    pub letters: &'a [DeadLetter],
    pub next_after: Option<i64>,
    /// Types with dead letters, and how many each.
    pub types: &'a [(String, u64)],
}

pub(crate) fn dead(page: Page<'_>, d: &DeadPage<'_>) -> String {
    let base = escape(page.base);
    let total: u64 = d.types.iter().map(|(_, n)| n).sum();
    let mut body = format!(
        "<h1>Dead letters</h1><form class=\"filters\" method=\"get\" action=\"{base}/dead\">\
         {}{}<button id=\"filter\">Filter</button> <a href=\"{base}/dead\">clear</a></form>",
        field(d.query, "type", "type", 18),
        field(d.query, "key", "ordering key", 14),
    );
    if total > 0 {
        body.push_str(
            "<h2>In bulk</h2><table id=\"bulk\"><tr><th>type</th><th>dead</th><th></th></tr>",
        );
        let mut row = |label: String, count: u64, query: String| {
            let _ = write!(
                body,
                "<tr><td>{label}</td><td>{count}</td><td>\
                 <a class=\"bulk-requeue\" href=\"{base}/dead/confirm?action=requeue{query}\">re-queue…</a> · \
                 <a class=\"bulk-purge\" href=\"{base}/dead/confirm?action=purge{query}\">purge…</a></td></tr>"
            );
        };
        for (t, count) in d.types {
            row(escape(t), *count, format!("&amp;type={}", encode(t)));
        }
        row("<i>every type</i>".to_owned(), total, String::new());
        body.push_str("</table>");
    }
    body.push_str(
        "<h2>Oldest first</h2><table id=\"dead-letters\"><tr><th>#</th><th>type</th><th>key</th>\
         <th>attempts</th><th>failed</th><th>last error</th><th>payload</th><th></th></tr>",
    );
    for letter in d.letters {
        let _ = write!(
            body,
            "<tr class=\"dead-letter\"><td><a href=\"{base}/messages/{id}\">#{position}</a></td>\
             <td>{t}</td><td>{key}</td><td>{attempts}</td><td>{failed}</td>\
             <td><pre>{error}</pre></td><td><pre>{payload}</pre></td><td>{actions}</td></tr>",
            id = letter.message_id,
            position = letter.position,
            t = escape(&letter.message_type),
            key = escape(letter.ordering_key.as_deref().unwrap_or("")),
            attempts = letter.attempts,
            failed = when(letter.failed_at),
            error = escape(&short(&letter.last_error, 300)),
            payload = escape(&preview(&letter.payload, letter.payload_truncated)),
            actions = dead_actions(&base, letter.position),
        );
    }
    if d.letters.is_empty() {
        body.push_str("<tr><td colspan=\"8\">No dead letters.</td></tr>");
    }
    body.push_str("</table>");
    body.push_str(&next_link(
        page.base,
        "/dead",
        d.query,
        &["type", "key"],
        d.next_after,
    ));
    layout(page, "Dead letters", &body, None)
}

/// A bulk action on dead letters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bulk<'a> {
    pub requeue: bool,
    /// `None`: every dead letter.
    pub message_type: Option<&'a str>,
}

pub(crate) fn confirm(
    page: Page<'_>,
    bulk: Bulk<'_>,
    count: usize,
    changed: Option<usize>,
) -> String {
    let base = escape(page.base);
    let (verb, action, class) = if bulk.requeue {
        ("Re-queue", "requeue", "")
    } else {
        ("Purge", "purge", " class=\"danger\"")
    };
    let of = match bulk.message_type {
        Some(t) => format!("of type <b>{}</b>", escape(t)),
        None => "of every type".to_owned(),
    };
    let changed = changed
        .map(|was| {
            format!(
                "<p class=\"error\" id=\"changed\">The selection changed since you confirmed \
                 {was}: nothing was done. It is {count} now.</p>"
            )
        })
        .unwrap_or_default();
    let consequence = if bulk.requeue {
        "They go back into the outbox at their old positions and are delivered again."
    } else {
        "They are deleted for good."
    };
    let body = if count == 0 {
        format!(
            "<h1>{verb}</h1>{changed}<p id=\"confirm-count\">There are no dead letters {of}.</p>\
             <p><a href=\"{base}/dead\">Back</a></p>"
        )
    } else {
        format!(
            "<h1>{verb} {count}?</h1>{changed}<p id=\"confirm-count\">{verb} <b>{count}</b> {noun} {of}? \
             {consequence}</p><form method=\"post\" action=\"{base}/dead/{action}\">\
             <input type=\"hidden\" name=\"type\" value=\"{t}\">\
             <input type=\"hidden\" name=\"count\" value=\"{count}\">\
             <button id=\"confirm\"{class}>{verb} {count}</button> \
             <a href=\"{base}/dead\">Cancel</a></form>",
            t = escape(bulk.message_type.unwrap_or("")),
            noun = if count == 1 { "dead letter" } else { "dead letters" },
        )
    };
    layout(page, verb, &body, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_controls_and_bidi_overrides_are_escaped() {
        assert_eq!(
            escape("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
        assert_eq!(escape("line\nnext\ttab"), "line\nnext\ttab");
        assert_eq!(escape("\u{1b}[31mred\r"), "\\u{1b}[31mred\\u{d}");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
    }

    #[test]
    fn json_payloads_are_indented_and_others_kept() {
        assert_eq!(
            pretty("{\"a\":[1,2]}"),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(pretty("not json"), "not json");
    }

    #[test]
    fn times_read_as_ago_and_ahead() {
        let now = SystemTime::now();
        assert!(when(now - Duration::from_secs(90)).contains(">1m ago<"));
        assert!(when(now + Duration::from_secs(7200 + 30)).contains(">in 2h<"));
        assert!(when(now - Duration::from_secs(3 * 86_400)).contains(">3d ago<"));
        assert!(when(now - Duration::from_secs(5)).contains(" GMT\">"));
    }

    #[test]
    fn texts_are_cut_at_characters() {
        assert_eq!(short("héllo", 2), "hé…");
        assert_eq!(short("hé", 2), "hé");
    }
}
