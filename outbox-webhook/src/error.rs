//! [`WebhookError`]: why an endpoint could not be built or a delivery did not succeed,
//! classified for the worker.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use outbox_core::destination::{DeliveryError, Scope};
use outbox_core::FailureKind;

/// Why a webhook endpoint could not be built, or a delivery did not succeed.
///
/// Messages name the endpoint by its URL (with any password removed) and never contain signing
/// secrets or the values of extra headers.
/// [`into_delivery_error`](WebhookError::into_delivery_error) classifies it for the worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The text is not a `whsec_<base64>` secret.
    #[error(
        "the webhook secret is not a Standard Webhooks secret: {reason}; expected `whsec_` \
         followed by the key in base64, as the receiver shows it"
    )]
    InvalidSecret {
        /// What is wrong with it (never the secret itself).
        reason: &'static str,
    },

    /// The endpoint URL does not parse, or has no host.
    #[error(
        "the webhook URL is not valid: {reason}; give an absolute URL such as \
         https://example.com/hooks"
    )]
    InvalidUrl {
        /// Why it was refused.
        reason: String,
    },

    /// The endpoint URL is neither `http` nor `https`.
    #[error("webhook URL scheme `{scheme}` is not supported; use http or https")]
    UnsupportedScheme {
        /// The scheme given.
        scheme: String,
    },

    /// The endpoint was built without any signing secret.
    #[error(
        "webhook {url} has no signing secret; add one with `WebhookEndpointBuilder::secret` \
         (receivers reject unsigned deliveries)"
    )]
    NoSecret {
        /// The endpoint.
        url: String,
    },

    /// An extra header would replace one the endpoint sets itself.
    #[error(
        "header `{name}` cannot be set on a webhook delivery: the endpoint sets it itself \
         (reserved: every webhook-* header, content-type, content-length, content-encoding, \
         host, transfer-encoding, connection, keep-alive, te, trailer, upgrade)"
    )]
    ReservedHeader {
        /// The header name, lower-cased.
        name: String,
    },

    /// An extra or message header's name or value is not valid in HTTP.
    #[error("webhook header `{name}` is invalid: {reason}")]
    InvalidHeader {
        /// The header name as given.
        name: String,
        /// What is wrong (never the value itself).
        reason: &'static str,
    },

    /// The HTTP client could not be set up (e.g. no TLS backend).
    #[error("the HTTP client for webhook {url} could not be built")]
    Client {
        /// The endpoint.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },

    /// The sending thread could not set up its HTTP client or the runtime it runs on (the
    /// process is out of file descriptors, say). Nothing was sent; the delivery is tried again,
    /// not held against the receiver.
    #[error("could not send to webhook {url}: this thread's HTTP client could not be set up")]
    Sender {
        /// The endpoint.
        url: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The payload could not be written as JSON.
    #[error("the webhook payload could not be serialized to JSON")]
    Serialize(#[source] serde_json::Error),

    /// The endpoint's host is, or resolves only to, special-purpose addresses (private, loopback,
    /// link-local, ...), which are refused to keep deliveries from reaching internal services.
    #[error(
        "webhook {url} was refused: host `{host}` leads only to special-purpose (private, \
         loopback, link-local or reserved) addresses ({}); if this receiver is trusted, open its \
         address with `WebhookEndpointBuilder::allow_address`",
        join(addresses)
    )]
    BlockedAddress {
        /// The endpoint.
        url: String,
        /// The host in the URL.
        host: String,
        /// The refused addresses the host is or resolved to.
        addresses: Vec<IpAddr>,
    },

    /// The receiver did not answer in time.
    #[error("webhook {url} did not answer within {timeout:?}")]
    Timeout {
        /// The endpoint.
        url: String,
        /// The endpoint's configured timeout.
        timeout: Duration,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// No connection could be made (name not found, connection refused, TLS failure).
    #[error("could not connect to webhook {url}")]
    Connect {
        /// The endpoint.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },

    /// The connection failed during the exchange, e.g. it was closed before the answer.
    #[error("the exchange with webhook {url} failed")]
    Transport {
        /// The endpoint.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },

    /// The receiver answered with a status other than 2xx or 3xx.
    #[error("webhook {url} answered {}{}{}", status_line(*status), retry_note(*retry_after), excerpt_note(excerpt))]
    Status {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body (about 200 characters, lossily decoded).
        excerpt: String,
        /// The receiver's `Retry-After`, clamped to the endpoint's maximum.
        retry_after: Option<Duration>,
    },

    /// The receiver answered with a redirect, which is not followed: a redirect could lead the
    /// signed payload to a host the endpoint was not configured for.
    #[error(
        "webhook {url} answered {} redirecting to `{location}`; redirects are not followed, so \
         configure the endpoint with the final URL",
        status_line(*status)
    )]
    Redirect {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The `Location` header, empty if there was none.
        location: String,
    },
}

impl WebhookError {
    /// How long the receiver asked to wait before the next attempt (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            WebhookError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The failure, classified for the worker, with the whole chain of causes as the reason:
    ///
    /// - `429`, and `503` with a `Retry-After`: the receiver pushes back; every delivery to it
    ///   waits that long (1 s without a `Retry-After`), and no attempt is counted;
    /// - timeouts, connection failures, `408`, `425` and other `5xx`: the receiver is down or
    ///   failing; retried (after its `Retry-After`, if it sent one), and enough in a row pause
    ///   the endpoint;
    /// - `410 Gone`: the receiver will never take a delivery again; the endpoint is disabled;
    /// - other statuses and redirects: permanent failures of this message;
    /// - what never left (a refused address, a header that cannot be sent, a bad
    ///   configuration): permanent, telling nothing of the receiver.
    pub fn into_delivery_error(self) -> DeliveryError {
        let mut reason = self.to_string();
        let mut source = std::error::Error::source(&self);
        while let Some(cause) = source {
            let _ = write!(reason, ": {cause}");
            source = cause.source();
        }
        let retry_after = self.retry_after();
        let error = match &self {
            WebhookError::Timeout { .. }
            | WebhookError::Connect { .. }
            | WebhookError::Transport { .. } => DeliveryError::unavailable(reason),
            WebhookError::Status { status: 429, .. } => {
                DeliveryError::push_back(reason, retry_after.unwrap_or(DEFAULT_PUSH_BACK))
            }
            WebhookError::Status {
                status: 503,
                retry_after: Some(wait),
                ..
            } => DeliveryError::push_back(reason, *wait),
            WebhookError::Status { status: 410, .. } => DeliveryError::gone(reason),
            WebhookError::Status { status, .. } if is_retryable_status(*status) => {
                DeliveryError::unavailable(reason)
            }
            WebhookError::Status { .. } | WebhookError::Redirect { .. } => {
                DeliveryError::permanent(reason)
            }
            // This process's trouble, not the receiver's: tried again, held against no one.
            WebhookError::Sender { .. } => {
                DeliveryError::new(FailureKind::Retryable, Scope::Unsent, reason)
            }
            _ => DeliveryError::new(FailureKind::Permanent, Scope::Unsent, reason),
        };
        match retry_after {
            Some(delay) if error.kind() == FailureKind::Retryable => error.not_before(delay),
            _ => error,
        }
    }
}

/// How long a receiver that answers `429` without a `Retry-After` is left alone.
const DEFAULT_PUSH_BACK: Duration = Duration::from_secs(1);

/// Whether an answer with this status is worth repeating the request for.
pub(crate) fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 500..=599)
}

fn status_line(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|code| code.canonical_reason())
    {
        Some(phrase) => format!("{status} {phrase}"),
        None => status.to_string(),
    }
}

fn retry_note(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(delay) => format!(" (retry after {delay:?})"),
        None => String::new(),
    }
}

fn excerpt_note(excerpt: &str) -> String {
    if excerpt.is_empty() {
        String::new()
    } else {
        format!(": {excerpt}")
    }
}

fn join(addresses: &[IpAddr]) -> String {
    let shown: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after: Option<Duration>) -> WebhookError {
        WebhookError::Status {
            url: "http://hooks.example/in".into(),
            status,
            excerpt: "busy".into(),
            retry_after,
        }
    }

    #[test]
    fn statuses_are_classified() {
        let classified = |code, retry_after| {
            let error = status(code, retry_after).into_delivery_error();
            (error.kind(), error.scope())
        };
        for code in [408, 425, 500, 502, 503, 599] {
            assert_eq!(
                classified(code, None),
                (FailureKind::Retryable, Scope::Destination),
                "{code}"
            );
        }
        let wait = Some(Duration::from_secs(2));
        for (code, retry_after) in [(429, None), (429, wait), (503, wait)] {
            assert_eq!(
                classified(code, retry_after),
                (FailureKind::Deferred, Scope::Destination),
                "{code} {retry_after:?}"
            );
        }
        assert_eq!(
            classified(410, None),
            (FailureKind::Permanent, Scope::Destination)
        );
        for code in [400, 401, 403, 404, 413, 422, 451] {
            assert_eq!(
                classified(code, None),
                (FailureKind::Permanent, Scope::Message),
                "{code}"
            );
        }
        let refused = WebhookError::InvalidSecret { reason: "short" }.into_delivery_error();
        assert_eq!(refused.scope(), Scope::Unsent);
    }

    #[test]
    fn the_classified_error_keeps_reason_and_retry_after() {
        let err = status(502, Some(Duration::from_secs(7))).into_delivery_error();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(err.delay(), Some(Duration::from_secs(7)));
        assert_eq!(
            err.reason(),
            "webhook http://hooks.example/in answered 502 Bad Gateway (retry after 7s): busy"
        );
        let pushed = status(429, Some(Duration::from_secs(3))).into_delivery_error();
        assert_eq!(pushed.delay(), Some(Duration::from_secs(3)));
        let gone = status(410, None).into_delivery_error();
        assert_eq!(gone.delay(), None);
    }
}
