//! Headers a message carries from its enqueue to its delivery: trace context, a tenant, a
//! correlation id. Webhook deliveries send them as HTTP headers, so they are held to what an
//! HTTP header can carry unchanged.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The W3C Trace Context header naming the trace and the span that enqueued the message.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C Trace Context header carrying vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

/// The most headers one message carries.
pub const MAX_HEADERS: usize = 64;
/// The most bytes of names and values one message's headers hold together.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// The longest header name, in bytes.
const MAX_NAME_BYTES: usize = 128;

/// Names a message may not set: destinations set them themselves (the body's framing), or
/// only the HTTP client may.
const RESERVED: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "host",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// Whether `name` (in any case) is a header a message may not set because destinations set it
/// themselves: every `outbox-*` header (the message's id, type and ordering key on brokers),
/// every `webhook-*` header (the Standard Webhooks id, timestamp and signature) and the body's
/// framing (`content-type`, `content-length`, `host`, ...).
pub fn is_reserved_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("webhook-") || name.starts_with("outbox-") || RESERVED.contains(&name.as_str())
}

/// A header name or value a message cannot carry, or headers too many or too large.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Not an HTTP header name.
    #[error("`{name}` is not a header name: use 1 to 128 letters, digits and !#$%&'*+-.^_`|~")]
    InvalidName {
        /// The name as given, with control characters escaped.
        name: String,
    },
    /// A value an HTTP header cannot carry unchanged.
    #[error(
        "the value of header `{name}` cannot be sent unchanged: use printable ASCII (and tabs), \
         without spaces at either end"
    )]
    InvalidValue {
        /// The header's name.
        name: String,
    },
    /// A name destinations set themselves.
    #[error(
        "header `{name}` is set by the destination itself (every outbox-* and webhook-* header \
         and the body's framing); a message cannot set it"
    )]
    Reserved {
        /// The header's name.
        name: String,
    },
    /// More headers than one message carries.
    #[error("a message carries at most {MAX_HEADERS} headers")]
    TooMany,
    /// Names and values larger than one message carries.
    #[error("a message's headers hold at most {MAX_HEADER_BYTES} bytes of names and values")]
    TooLarge,
    /// A stored header column that is not a JSON object of strings (a row edited by hand).
    #[error("the stored headers are not a JSON object of strings: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// The headers of one message: names (kept lowercase, as HTTP/2 sends them) to values.
///
/// ```
/// use outbox_core::Headers;
///
/// let mut headers = Headers::new();
/// headers.insert("X-Tenant", "acme")?;
/// assert_eq!(headers.get("x-tenant"), Some("acme"));
/// assert!(headers.insert("webhook-id", "forged").is_err());
/// # Ok::<(), outbox_core::HeaderError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets header `name` (in any case) to `value`, replacing an earlier value.
    ///
    /// Refuses what a webhook could not deliver unchanged: a name that is not an HTTP token, a
    /// value with anything but printable ASCII and tabs or with spaces at either end, a
    /// reserved name (see [`HeaderError::Reserved`]), more than [`MAX_HEADERS`] headers or
    /// [`MAX_HEADER_BYTES`] bytes.
    pub fn insert(&mut self, name: &str, value: &str) -> Result<(), HeaderError> {
        let name = checked_name(name)?;
        if !is_valid_value(value) {
            return Err(HeaderError::InvalidValue { name });
        }
        let replaced = self.0.get(&name).map_or(0, |old| name.len() + old.len());
        if replaced == 0 && self.0.len() >= MAX_HEADERS {
            return Err(HeaderError::TooMany);
        }
        if self.bytes() - replaced + name.len() + value.len() > MAX_HEADER_BYTES {
            return Err(HeaderError::TooLarge);
        }
        self.0.insert(name, value.to_owned());
        Ok(())
    }

    /// The value of header `name`, in any case.
    pub fn get(&self, name: &str) -> Option<&str> {
        match self.0.get(name) {
            Some(value) => Some(value),
            None => self.0.get(&name.to_ascii_lowercase()).map(String::as_str),
        }
    }

    /// Every header, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The trace id of a valid W3C `traceparent` header (32 lowercase hex digits), to join a
    /// worker's log lines to the trace of the request that enqueued the message.
    pub fn trace_id(&self) -> Option<&str> {
        let mut fields = self.get(TRACEPARENT)?.split('-');
        let (version, trace_id, span_id) = (fields.next()?, fields.next()?, fields.next()?);
        let hex = |text: &str, len: usize| {
            text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let valid = hex(version, 2)
            && version != "ff"
            && hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && hex(span_id, 16);
        valid.then_some(trace_id)
    }

    /// The headers as the JSON object a store keeps, or `None` when there are none.
    pub fn to_json(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        // A map of strings always serializes.
        serde_json::to_string(&self.0).ok()
    }

    /// Headers read back from a store's JSON object, checked as [`insert`](Headers::insert)
    /// checks them (the row may have been edited by hand). `None` is no headers.
    pub fn from_json(json: Option<&str>) -> Result<Headers, HeaderError> {
        let Some(json) = json else {
            return Ok(Headers::new());
        };
        let stored: BTreeMap<String, String> =
            serde_json::from_str(json).map_err(HeaderError::Malformed)?;
        let mut headers = Headers::new();
        for (name, value) in &stored {
            headers.insert(name, value)?;
        }
        Ok(headers)
    }

    fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum()
    }
}

#[cfg(feature = "opentelemetry")]
impl Headers {
    /// Sets `traceparent` (and `tracestate`, if any) from the span of the current
    /// OpenTelemetry context, unless a `traceparent` is set already or there is no valid span.
    ///
    /// With `tracing-opentelemetry`, enter the tracing span's context first
    /// (`tracing::Span::current().context().attach()`) for it to be the current one.
    pub fn insert_current_trace_context(&mut self) {
        use opentelemetry::trace::TraceContextExt as _;

        if self.get(TRACEPARENT).is_some() {
            return;
        }
        let context = opentelemetry::Context::current();
        let span = context.span();
        let span = span.span_context();
        if !span.is_valid() {
            return;
        }
        let parent = format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        );
        let state = span.trace_state().header();
        // Only when the message's own headers leave no room for them: it still goes out.
        let added = self.insert(TRACEPARENT, &parent).and_then(|()| {
            if state.is_empty() {
                Ok(())
            } else {
                self.insert(TRACESTATE, &state)
            }
        });
        if let Err(error) = added {
            log::debug!("outbox: the current trace context is not carried: {error}");
        }
    }

    /// An OpenTelemetry context whose remote parent is the span named by `traceparent` (with
    /// `tracestate`), or `None` without a valid one. The worker runs handlers inside it.
    pub fn remote_trace_context(&self) -> Option<opentelemetry::Context> {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        };

        let trace_id = TraceId::from_hex(self.trace_id()?).ok()?;
        let mut fields = self.get(TRACEPARENT)?.split('-').skip(2);
        let span_id = SpanId::from_hex(fields.next()?).ok()?;
        let flags = u8::from_str_radix(fields.next()?.get(..2)?, 16).ok()?;
        let state = self
            .get(TRACESTATE)
            .and_then(|state| state.parse::<TraceState>().ok())
            .unwrap_or_default();
        let span = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
        Some(opentelemetry::Context::new().with_remote_span_context(span))
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = BTreeMap::<String, String>::deserialize(deserializer)?;
        let mut headers = Headers::new();
        for (name, value) in &stored {
            headers
                .insert(name, value)
                .map_err(serde::de::Error::custom)?;
        }
        Ok(headers)
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

fn checked_name(name: &str) -> Result<String, HeaderError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid {
        return Err(HeaderError::InvalidName {
            name: name.escape_debug().to_string(),
        });
    }
    if is_reserved_header(name) {
        return Err(HeaderError::Reserved {
            name: name.to_ascii_lowercase(),
        });
    }
    Ok(name.to_ascii_lowercase())
}

fn is_valid_value(value: &str) -> bool {
    let visible = |b: u8| (0x21..=0x7e).contains(&b);
    let bytes = value.as_bytes();
    bytes.iter().all(|&b| visible(b) || b == b' ' || b == b'\t')
        && bytes.first().is_none_or(|&b| visible(b))
        && bytes.last().is_none_or(|&b| visible(b))
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "opentelemetry")]
    #[test]
    fn the_current_span_becomes_traceparent_and_comes_back_as_the_remote_parent() {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        };

        let mut without_span = Headers::new();
        without_span.insert_current_trace_context();
        assert!(without_span.is_empty());

        let state: TraceState = "vendor=value".parse().unwrap();
        let span = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            state,
        );
        let _entered = opentelemetry::Context::new()
            .with_remote_span_context(span.clone())
            .attach();
        let mut headers = Headers::new();
        headers.insert_current_trace_context();
        assert_eq!(
            headers.get(TRACEPARENT),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(headers.get(TRACESTATE), Some("vendor=value"));

        let mut explicit = Headers::new();
        explicit
            .insert(
                TRACEPARENT,
                "00-11111111111111111111111111111111-2222222222222222-00",
            )
            .unwrap();
        explicit.insert_current_trace_context();
        assert_eq!(
            explicit.trace_id(),
            Some("11111111111111111111111111111111")
        );

        let remote = headers.remote_trace_context().unwrap();
        let parent = remote.span().span_context().clone();
        assert_eq!(parent.trace_id(), span.trace_id());
        assert_eq!(parent.span_id(), span.span_id());
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(parent.trace_state().header(), "vendor=value");
        assert!(Headers::new().remote_trace_context().is_none());
    }

    use super::*;

    #[test]
    fn names_are_case_insensitive_and_kept_lowercase() {
        let mut headers = Headers::new();
        headers.insert("X-Tenant", "acme").unwrap();
        headers.insert("x-tenant", "globex").unwrap();
        assert_eq!(headers.len(), 1);
        assert_eq!(headers.get("X-TENANT"), Some("globex"));
        assert_eq!(headers.iter().collect::<Vec<_>>(), [("x-tenant", "globex")]);
        assert_eq!(headers.get("absent"), None);
    }

    #[test]
    fn what_http_cannot_carry_unchanged_is_refused() {
        let mut headers = Headers::new();
        for name in [
            "",
            "bad name",
            "x:y",
            "naïve",
            "line\nbreak",
            &"n".repeat(129),
        ] {
            assert!(
                matches!(
                    headers.insert(name, "v"),
                    Err(HeaderError::InvalidName { .. })
                ),
                "{name:?}"
            );
        }
        for value in [
            "a\r\nx-injected: 1",
            "nul\0",
            " padded",
            "padded\t",
            "é",
            "\u{1b}[31m",
        ] {
            assert!(
                matches!(
                    headers.insert("x-v", value),
                    Err(HeaderError::InvalidValue { .. })
                ),
                "{value:?}"
            );
        }
        headers.insert("x-empty", "").unwrap();
        headers.insert("x-inner-space", "a b\tc").unwrap();
        let shown = HeaderError::InvalidName {
            name: "line\nbreak".escape_debug().to_string(),
        }
        .to_string();
        assert!(!shown.contains('\n'), "{shown}");
    }

    #[test]
    fn webhook_headers_and_framing_are_reserved() {
        let mut headers = Headers::new();
        for name in [
            "webhook-id",
            "Webhook-Signature",
            "webhook-anything",
            "Content-Type",
            "host",
        ] {
            assert!(
                matches!(headers.insert(name, "x"), Err(HeaderError::Reserved { .. })),
                "{name}"
            );
        }
        assert!(headers.is_empty());
    }

    #[test]
    fn count_and_size_are_bounded_but_replacing_is_not_growing() {
        let mut headers = Headers::new();
        for i in 0..MAX_HEADERS {
            headers.insert(&format!("x-{i}"), "v").unwrap();
        }
        assert!(matches!(
            headers.insert("x-one-more", "v"),
            Err(HeaderError::TooMany)
        ));
        headers.insert("x-0", "replaced").unwrap();

        let mut big = Headers::new();
        let value = "v".repeat(MAX_HEADER_BYTES - "x-big".len());
        big.insert("x-big", &value).unwrap();
        big.insert("x-big", &value).unwrap();
        assert!(matches!(
            big.insert("x-more", "v"),
            Err(HeaderError::TooLarge)
        ));
    }

    #[test]
    fn stored_json_round_trips_and_hand_edited_rows_are_checked() {
        let mut headers = Headers::new();
        headers
            .insert(
                TRACEPARENT,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .unwrap();
        headers.insert("x-quote", r#"say "hi" \ bye"#).unwrap();
        let json = headers.to_json().unwrap();
        assert_eq!(Headers::from_json(Some(&json)).unwrap(), headers);
        assert_eq!(Headers::new().to_json(), None);
        assert!(Headers::from_json(None).unwrap().is_empty());
        assert!(matches!(
            Headers::from_json(Some("[1]")),
            Err(HeaderError::Malformed(_))
        ));
        assert!(matches!(
            Headers::from_json(Some(r#"{"webhook-id":"x"}"#)),
            Err(HeaderError::Reserved { .. })
        ));
        assert!(serde_json::from_str::<Headers>(r#"{"bad name":"x"}"#).is_err());
    }

    #[test]
    fn the_trace_id_comes_only_from_a_valid_traceparent() {
        let with = |value: &str| {
            let mut headers = Headers::new();
            headers.insert(TRACEPARENT, value).unwrap();
            headers
        };
        let valid = with("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(valid.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for invalid in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f35-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert_eq!(with(invalid).trace_id(), None, "{invalid}");
        }
        assert_eq!(Headers::new().trace_id(), None);
    }
}
