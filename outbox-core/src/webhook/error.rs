use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use super::endpoint::MAX_ENDPOINT_NAME;
use crate::error::{FailureKind, ProcessError};

/// Why a webhook endpoint could not be built, or a delivery did not succeed.
///
/// Messages name the endpoint by its URL (with any password removed) and never contain signing
/// secrets or the values of extra headers. [`failure_kind`](WebhookError::failure_kind) says
/// whether a later attempt may succeed, and
/// [`into_process_error`](WebhookError::into_process_error) turns the error into what a
/// [`Handler`](crate::Handler) returns.
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

    /// The endpoint's name is empty or longer than the store keeps.
    #[error(
        "webhook endpoint name {name:?} is {problem}: a name is 1 to {MAX_ENDPOINT_NAME} \
         characters (it keys the endpoint's health in the outbox_endpoint table)"
    )]
    InvalidName {
        /// The name as given.
        name: String,
        /// `empty` or `too long`.
        problem: &'static str,
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
    /// Whether a later attempt may succeed: timeouts, connection failures and the statuses
    /// 408, 425, 429 and 5xx are retryable; everything else, including every configuration
    /// error, is permanent.
    pub fn failure_kind(&self) -> FailureKind {
        match self {
            WebhookError::Timeout { .. }
            | WebhookError::Connect { .. }
            | WebhookError::Transport { .. } => FailureKind::Retryable,
            WebhookError::Status { status, .. } if is_retryable_status(*status) => {
                FailureKind::Retryable
            }
            _ => FailureKind::Permanent,
        }
    }

    /// How long the receiver asked to wait before the next attempt (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            WebhookError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The [`ProcessError`] a handler returns for this failure: same kind, the message with its
    /// whole chain of causes as the reason, and the receiver's `Retry-After`.
    ///
    /// (`ProcessError` has a blanket `From` for every error type, which would make every failure
    /// retryable; this keeps the kind.)
    pub fn into_process_error(self) -> ProcessError {
        let mut reason = self.to_string();
        let mut source = std::error::Error::source(&self);
        while let Some(cause) = source {
            let _ = write!(reason, ": {cause}");
            source = cause.source();
        }
        let error = match self.failure_kind() {
            FailureKind::Retryable => ProcessError::retryable(reason),
            _ => ProcessError::permanent(reason),
        };
        match self.retry_after() {
            Some(delay) => error.with_retry_after(delay),
            None => error,
        }
    }
}

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
        for code in [408, 425, 429, 500, 502, 503, 599] {
            assert_eq!(
                status(code, None).failure_kind(),
                FailureKind::Retryable,
                "{code}"
            );
        }
        for code in [400, 401, 403, 404, 410, 413, 422, 451] {
            assert_eq!(
                status(code, None).failure_kind(),
                FailureKind::Permanent,
                "{code}"
            );
        }
    }

    #[test]
    fn the_process_error_keeps_kind_reason_and_retry_after() {
        let err = status(503, Some(Duration::from_secs(7))).into_process_error();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(
            err.reason(),
            "webhook http://hooks.example/in answered 503 Service Unavailable (retry after 7s): busy"
        );
        let gone = status(410, None).into_process_error();
        assert_eq!(gone.kind(), FailureKind::Permanent);
        assert_eq!(gone.retry_after(), None);
    }
}
