//! Server-rendered HTML, small and escaped.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use outbox_diesel::subscription::SubscriptionInfo;
use rocket::response::content::RawHtml;

use crate::db::{Delivery, Post, ShownComment};

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body{font:16px/1.5 system-ui,sans-serif;max-width:60rem;margin:0 auto;padding:1rem 1.5rem;color:#1d2330;background:#fbfbfd}
nav{display:flex;gap:1.25rem;border-bottom:1px solid #dde;padding-bottom:.5rem;margin-bottom:1rem}
nav a{color:#3450a1;text-decoration:none;font-weight:600}
h1{font-size:1.6rem;margin:.5rem 0} h2{font-size:1.2rem;margin-top:2rem}
.notice{background:#e8f4ea;border:1px solid #9cc9a5;padding:.5rem .75rem;border-radius:6px}
.error{background:#fbeaea;border:1px solid #e3a1a1;padding:.5rem .75rem;border-radius:6px}
.comment{border-left:3px solid #c9d3ee;padding:.25rem .75rem;margin:.75rem 0}
.meta{color:#667;font-size:.85rem}
form.stack{display:grid;gap:.5rem;max-width:32rem}
input,textarea{font:inherit;padding:.4rem;border:1px solid #bbc;border-radius:4px}
button{font:inherit;padding:.35rem .8rem;border:1px solid #3450a1;background:#3450a1;color:#fff;border-radius:4px;cursor:pointer}
button.quiet{background:#fff;color:#3450a1} button.danger{background:#a13434;border-color:#a13434}
table{border-collapse:collapse;width:100%;font-size:.9rem} td,th{border-bottom:1px solid #e3e3ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
td pre{margin:0;white-space:pre-wrap;word-break:break-all;max-width:22rem}
.counts{display:flex;gap:1rem} .count{background:#fff;border:1px solid #dde;border-radius:6px;padding:.5rem 1rem}
.count b{display:block;font-size:1.4rem}
.ok{color:#1c7a35} .bad{color:#a13434}
form.inline{display:inline}
";

fn layout(title: &str, body: &str) -> RawHtml<String> {
    RawHtml(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\
         <nav><a href=\"/posts/1\">Blog</a><a href=\"/receiver\">Mail receiver</a>\
         <a href=\"/outbox\">Outbox admin</a></nav>{body}</body></html>",
        title = escape(title),
    ))
}

fn ago(unix_seconds: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(unix_seconds);
    let age = (now - unix_seconds).max(0);
    match age {
        0..=59 => format!("{age}s ago"),
        60..=3599 => format!("{}m ago", age / 60),
        _ => format!("{}h ago", age / 3600),
    }
}

fn message(notice: Option<&str>, error: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(notice) = notice {
        let _ = write!(
            out,
            "<p class=\"notice\" id=\"notice\">{}</p>",
            escape(notice)
        );
    }
    if let Some(error) = error {
        let _ = write!(out, "<p class=\"error\" id=\"error\">{}</p>", escape(error));
    }
    out
}

/// A post with its comments and the comment form.
pub fn post(
    post: &Post,
    comments: &[ShownComment],
    notice: Option<&str>,
    error: Option<&str>,
) -> RawHtml<String> {
    let mut body = format!(
        "<h1>{}</h1><p>{}</p>{}<h2>{} comments</h2>",
        escape(&post.title),
        escape(&post.body),
        message(notice, error),
        comments.len()
    );
    for comment in comments {
        let _ = write!(
            body,
            "<div class=\"comment\"><p>{}</p><p class=\"meta\">{} · {}</p></div>",
            escape(&comment.body),
            escape(&comment.author),
            ago(comment.created_at)
        );
    }
    let _ = write!(
        body,
        "<h2>Leave a comment</h2>\
         <form class=\"stack\" method=\"post\" action=\"/posts/{id}/comments\">\
         <input name=\"name\" id=\"name\" placeholder=\"Your name\" required>\
         <input name=\"email\" id=\"email\" type=\"email\" placeholder=\"you@example.com\" required>\
         <textarea name=\"body\" id=\"body\" rows=\"4\" placeholder=\"Your comment\" required></textarea>\
         <button type=\"submit\" id=\"submit\">Post comment</button></form>\
         <p class=\"meta\">Commenting subscribes you to this post. Your first comment ever earns a \
         thank-you mail; each later comment by someone else sends you a notification. Both go \
         through the outbox: see them arrive at the <a href=\"/receiver\">mail receiver</a>.</p>\
         <p class=\"meta\">Want this post's comments as webhooks? \
         <a id=\"webhooks-link\" href=\"/posts/{id}/webhooks\">Subscribe a webhook</a>.</p>",
        id = post.id
    );
    layout(&post.title, &body)
}

/// The built-in receiver's log and its failure switch.
pub fn receiver(deliveries: &[Delivery], failing: bool) -> RawHtml<String> {
    let (state, button, next) = if failing {
        (
            "<b class=\"bad\">failing: every delivery is answered 500</b>",
            "Make it healthy",
            "off",
        )
    } else {
        (
            "<b class=\"ok\">healthy: deliveries are verified and answered 200</b>",
            "Make it fail (500)",
            "on",
        )
    };
    let mut body = format!(
        "<h1>Mail receiver</h1><p>This stands in for a mail service. It verifies each webhook's \
         Standard Webhooks signature and records its id in an inbox table in the same transaction \
         as its log line, so a repeated delivery is recorded once.</p>\
         <p id=\"receiver-state\">Now {state}.</p>\
         <form method=\"post\" action=\"/receiver/mode\"><input type=\"hidden\" name=\"failing\" \
         value=\"{next}\"><button id=\"toggle-failing\" class=\"quiet\">{button}</button></form>\
         <h2>Deliveries</h2><table id=\"deliveries\"><tr><th>#</th><th>received</th><th>type</th>\
         <th>outcome</th><th>webhook-id</th><th>body</th></tr>"
    );
    for delivery in deliveries {
        let class = if delivery.outcome.starts_with("verified") {
            "ok"
        } else {
            "bad"
        };
        let _ = write!(
            body,
            "<tr class=\"delivery\"><td>{}</td><td>{}</td><td class=\"type\">{}</td>\
             <td class=\"outcome {class}\">{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            delivery.id,
            ago(delivery.received_at),
            escape(&delivery.message_type),
            escape(&delivery.outcome),
            attempts_link(&delivery.webhook_id),
            escape(&delivery.body)
        );
    }
    body.push_str("</table>");
    layout("Mail receiver", &body)
}

/// A delivery's `webhook-id`, linked to the outbox's page of that message, which lists every
/// attempt at it from the delivery log; shown as it is when it is not a message id (anyone
/// can post to the receiver).
fn attempts_link(webhook_id: &str) -> String {
    match webhook_id.parse::<outbox_diesel::MessageId>() {
        Ok(id) => format!(
            "<a class=\"attempts\" href=\"/outbox/messages/{id}\" title=\"its attempts\">\
             <code>{id}</code></a>"
        ),
        Err(_) => format!("<code>{}</code>", escape(webhook_id)),
    }
}

/// A post's webhook subscriptions, the form to add one, and what arrived at their hooks.
pub fn webhooks(
    post: &Post,
    listed: &[SubscriptionInfo],
    arrived: &[Delivery],
    notice: Option<&str>,
    error: Option<&str>,
) -> RawHtml<String> {
    let id = post.id;
    let mut body = format!(
        "<h1>Webhooks for “{title}”</h1>{message}\
         <p>Subscribe a webhook to this post's events: every comment posted here is written with \
         a <code>comment.posted</code> event in the comment's own transaction, and each \
         subscription that asks for it gets its own delivery, signed, retried and dead-lettered \
         on its own. In a real application you would give your endpoint's URL and get a secret, \
         shown once; here every hook is an endpoint of the blog's own, \
         <code>/receiver/readers/&lt;hook&gt;</code>, which checks each signature and logs what \
         arrives below.</p>\
         <form class=\"stack\" method=\"post\" action=\"/posts/{id}/webhooks\">\
         <label for=\"events\">Event types (exact names or <code>prefix.*</code>)</label>\
         <input name=\"events\" id=\"events\" value=\"comment.*\" required>\
         <button type=\"submit\" id=\"subscribe\">Subscribe a webhook</button></form>\
         <h2>Subscriptions</h2><table id=\"subscriptions\"><tr><th>id</th><th>event types</th>\
         <th>hook</th><th>state</th><th></th></tr>",
        title = escape(&post.title),
        message = message(notice, error),
    );
    for subscription in listed {
        let hook = subscription
            .url
            .rsplit('/')
            .next()
            .unwrap_or(&subscription.url);
        let _ = write!(
            body,
            "<tr class=\"subscription\"><td><code>{sid}</code></td><td>{types}</td>\
             <td><code>{hook}</code></td><td>{state}</td><td>\
             <form class=\"inline\" method=\"post\" action=\"/posts/{id}/webhooks/remove\">\
             <input type=\"hidden\" name=\"subscription\" value=\"{sid}\">\
             <button class=\"danger\">Remove</button></form></td></tr>",
            sid = escape(&subscription.id),
            types = escape(&subscription.event_types.join(", ")),
            hook = escape(hook),
            state = if subscription.enabled {
                "enabled"
            } else {
                "disabled"
            },
        );
    }
    let _ = write!(
        body,
        "</table><h2>Arrived at the hooks</h2><p class=\"meta\">At least once: a delivery \
         retried after a lost answer shows twice, with the same webhook-id. \
         <a href=\"/posts/{id}/webhooks\">Refresh</a> · <a href=\"/posts/{id}\">Back to the \
         post</a></p><table id=\"arrivals\"><tr><th>received</th><th>hook</th>\
         <th>webhook-id</th><th>body</th></tr>"
    );
    for delivery in arrived {
        let hook = delivery
            .outcome
            .rsplit(' ')
            .next()
            .unwrap_or(&delivery.outcome);
        let _ = write!(
            body,
            "<tr class=\"arrival\"><td>{}</td><td><code>{}</code></td><td><code>{}</code></td>\
             <td><pre>{}</pre></td></tr>",
            ago(delivery.received_at),
            escape(hook),
            escape(&delivery.webhook_id),
            escape(&delivery.body)
        );
    }
    body.push_str("</table>");
    layout(&format!("Webhooks for {}", post.title), &body)
}
