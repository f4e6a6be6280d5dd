//! The sender's side: one configured receiver and the signed POSTs to it.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_core::destination::{Answer, DeliveryError, Destination, Envelope};
use outbox_core::{is_reserved_header, Headers};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::Url;

use crate::client::ClientSettings;
use crate::error::{is_retryable_status, WebhookError};
use crate::guard::{AddressGuard, BlockedHost};
use crate::secret::WebhookSecret;

/// How long one delivery may take, connecting to the last byte of the answer, unless the
/// endpoint says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024;
const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);
/// How much of a failed answer's body goes into the error, in characters.
const EXCERPT_CHARS: usize = 200;
const USER_AGENT: &str = concat!("outbox-webhook/", env!("CARGO_PKG_VERSION"));

/// One webhook receiver: its URL, signing secrets, timeouts and how the HTTP clients that talk
/// to it are made. A [`Destination`]: give it to the worker under a name
/// (`Worker::builder(store).destination("mail", endpoint)`), and route message types to it or
/// deliver to it from handlers by that name.
///
/// Build it once with [`WebhookEndpoint::builder`] when the application starts: clones are
/// cheap and share one configuration. Each thread that delivers (a worker's handler thread)
/// sends through a client of its own, on a small runtime of its own: the request is written and
/// the answer read by that thread, with no hand-over to another, and its connections to the
/// receiver are kept alive and reused between its deliveries (so a receiver sees up to one
/// connection per handler thread).
///
/// A JSON message is POSTed as `{"id": <message id>, "type": <message type>, "data": <the
/// message's data>}`; a body of another content type is POSTed as it is. The message id is the
/// `webhook-id` (the same on every retry, so the receiver can drop duplicates) and the
/// message's headers (a `traceparent` among them) go along as HTTP headers, under the
/// endpoint's own.
///
/// Deliveries are signed the [Standard Webhooks](https://www.standardwebhooks.com) way, are not
/// redirected, ignore proxy settings, and by default refuse special-purpose addresses (see
/// [`is_special_purpose`](super::is_special_purpose)) so that a configured URL cannot be used
/// to reach internal services.
///
/// Sending blocks the calling thread: call it from worker threads (as handlers run) or an async
/// runtime's blocking pool (`spawn_blocking`), never from async code itself. Building an
/// endpoint does not block, and may happen anywhere.
#[derive(Clone)]
pub struct WebhookEndpoint {
    inner: Arc<Inner>,
}

struct Inner {
    url: Url,
    /// The URL as shown in errors and logs: without its password.
    shown_url: String,
    /// The URL's host, if it is an IP address: the client dials those without the resolver.
    literal_ip: Option<IpAddr>,
    secrets: Vec<WebhookSecret>,
    headers: HeaderMap,
    allowed: Vec<IpAddr>,
    /// How each thread's client is made (timeouts, address guard); shared by the endpoints
    /// made with [`WebhookEndpoint::to_url`], which so share each thread's client and
    /// connections.
    client: Arc<ClientSettings>,
    max_response_body: usize,
    max_retry_after: Duration,
}

/// Configuration of a [`WebhookEndpoint`], from [`WebhookEndpoint::builder`].
pub struct WebhookEndpointBuilder {
    url: String,
    secrets: Vec<WebhookSecret>,
    timeout: Duration,
    connect_timeout: Duration,
    headers: Vec<(String, String)>,
    allowed: Vec<IpAddr>,
    max_response_body: usize,
    max_retry_after: Duration,
}

impl WebhookEndpoint {
    /// Starts configuring an endpoint that POSTs to `url` (`http` or `https`).
    pub fn builder(url: impl Into<String>) -> WebhookEndpointBuilder {
        WebhookEndpointBuilder {
            url: url.into(),
            secrets: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            headers: Vec::new(),
            allowed: Vec::new(),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
        }
    }

    /// An endpoint like this one, posting to `url` signed with `secrets`: it shares this one's
    /// HTTP clients (each thread's client and connections), address guard, timeouts and extra
    /// headers. For many receivers behind one configuration (a service's subscribers), without
    /// a client each. Fails as [`WebhookEndpointBuilder::build`] does on
    /// the URL and the secrets.
    pub fn to_url(
        &self,
        url: &str,
        secrets: Vec<WebhookSecret>,
    ) -> Result<WebhookEndpoint, WebhookError> {
        let (url, literal_ip, shown_url) = parse_url(url)?;
        if secrets.is_empty() {
            return Err(WebhookError::NoSecret { url: shown_url });
        }
        let inner = &*self.inner;
        Ok(WebhookEndpoint {
            inner: Arc::new(Inner {
                url,
                shown_url,
                literal_ip,
                secrets,
                headers: inner.headers.clone(),
                allowed: inner.allowed.clone(),
                client: Arc::clone(&inner.client),
                max_response_body: inner.max_response_body,
                max_retry_after: inner.max_retry_after,
            }),
        })
    }

    /// The receiver's URL.
    pub fn url(&self) -> &Url {
        &self.inner.url
    }

    /// The limit on one whole request, from connecting to reading the answer.
    pub fn timeout(&self) -> Duration {
        self.inner.client.timeout()
    }

    /// The limit on establishing a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.inner.client.connect_timeout()
    }

    /// POSTs `body` signed with `msg_id` as `webhook-id`, and returns whatever the receiver
    /// answered, without judging the status: use [`WebhookResponse::error_for_status`] for that.
    /// Not through a worker's health gate: for tools and tests of a receiver.
    ///
    /// Errors are those of not getting an answer: a refused address, a timeout, a failed
    /// connection, or a `msg_id` that cannot be a header value.
    pub fn post(&self, msg_id: &str, body: &[u8]) -> Result<WebhookResponse, WebhookError> {
        self.post_owned(msg_id, &Headers::new(), "application/json", body.to_vec())
    }

    fn post_owned(
        &self,
        msg_id: &str,
        message_headers: &Headers,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<WebhookResponse, WebhookError> {
        let inner = &*self.inner;
        if let Some(ip) = inner.literal_ip {
            if !inner.client.permits(ip) {
                return Err(WebhookError::BlockedAddress {
                    url: inner.shown_url.clone(),
                    host: ip.to_string(),
                    addresses: vec![ip],
                });
            }
        }
        let id = HeaderValue::from_str(msg_id).map_err(|_| WebhookError::InvalidHeader {
            name: "webhook-id".into(),
            reason: "the message id contains characters not allowed in a header value",
        })?;
        let message_headers = header_map(message_headers)?;
        let content_type =
            HeaderValue::from_str(content_type).map_err(|_| WebhookError::InvalidHeader {
                name: "content-type".into(),
                reason: "the content type contains characters not allowed in a header value",
            })?;
        let timestamp = unix_now();
        let signatures: Vec<String> = inner
            .secrets
            .iter()
            .map(|secret| secret.sign(msg_id, timestamp, &body))
            .collect();

        let started = Instant::now();
        let cap = inner.max_response_body;
        let exchange = |client: reqwest::Client| async move {
            let mut response = client
                .post(inner.url.clone())
                // The whole exchange, the answer's body included (a receiver trickling its
                // answer does not stretch it).
                .timeout(inner.client.timeout())
                // The endpoint's own headers replace a message's of the same name: a message
                // cannot override the receiver's credentials, nor any header set below.
                .headers(message_headers)
                .headers(inner.headers.clone())
                .header(CONTENT_TYPE, content_type)
                .header("webhook-id", id)
                .header("webhook-timestamp", timestamp)
                .header("webhook-signature", signatures.join(" "))
                .body(body)
                .send()
                .await?;
            let mut answer = Answered {
                status: response.status().as_u16(),
                headers: response.headers().clone(),
                body: Vec::new(),
                unread: None,
            };
            // Read to its end (which returns the connection to the pool), or up to the cap.
            while answer.body.len() < cap {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        let room = cap - answer.body.len();
                        answer
                            .body
                            .extend_from_slice(&chunk[..chunk.len().min(room)]);
                    }
                    Ok(None) => break,
                    Err(error) => {
                        answer.unread = Some(error);
                        break;
                    }
                }
            }
            Ok::<_, reqwest::Error>(answer)
        };
        let Answered {
            status,
            headers,
            body,
            unread,
        } = inner
            .client
            .run(exchange)
            .map_err(|source| WebhookError::Sender {
                url: inner.shown_url.clone(),
                source,
            })?
            .map_err(|error| inner.send_error(error))?;
        // The status is the receiver's verdict; a body cut short only shortens the excerpt. A
        // body still coming at the deadline is a timeout: the attempt did not complete.
        if let Some(error) = unread {
            if started.elapsed() >= inner.client.timeout() || error.is_timeout() {
                return Err(WebhookError::Timeout {
                    url: inner.shown_url.clone(),
                    timeout: inner.client.timeout(),
                    source: Box::new(error.without_url()),
                });
            }
            log::debug!(
                "webhook {} for message {msg_id}: reading the answer failed after {} bytes: {error}",
                inner.shown_url,
                body.len()
            );
        }
        log::debug!(
            "webhook {} for message {msg_id} answered {status} in {:?}",
            inner.shown_url,
            started.elapsed()
        );
        let retry_after = if is_retryable_status(status) {
            headers
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| parse_retry_after(value, SystemTime::now()))
                .map(|delay| delay.min(inner.max_retry_after))
        } else {
            None
        };
        Ok(WebhookResponse {
            url: inner.shown_url.clone(),
            status,
            headers,
            body,
            retry_after,
        })
    }
}

impl Destination for WebhookEndpoint {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    /// POSTs the envelope (see the type's documentation) and classifies the answer: 2xx is
    /// delivered; `429`, and `503` with a `Retry-After`, push back (the whole destination
    /// waits, no attempt counted); timeouts, connection failures, `408`, `425` and other `5xx`
    /// are retryable failures of the destination; `410 Gone` says it is gone; other statuses
    /// and redirects are permanent failures of the message.
    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_answered(envelope).map(drop)
    }

    /// Delivers as [`deliver`](Destination::deliver) does; the answer is the status and the
    /// start of the response body, for the delivery log.
    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        let id = envelope.message_id.to_string();
        let body = if envelope.is_json() {
            wrapped(&id, &envelope.message_type, &envelope.body)
        } else {
            envelope.body.clone()
        };
        let response = self
            .post_owned(&id, &envelope.headers, &envelope.content_type, body)
            .map_err(WebhookError::into_delivery_error)?;
        let answer = Answer::http(response.status, &response.body);
        match response.error_for_status() {
            Ok(_) => Ok(answer),
            Err(error) => Err(error.into_delivery_error().with_answer(answer)),
        }
    }

    fn timeout(&self) -> Duration {
        self.inner.client.timeout()
    }
}

/// The JSON body of a delivery: `{"id": .., "type": .., "data": <data>}`, with the data as it
/// is (it is JSON already), not decoded and encoded again.
fn wrapped(id: &str, message_type: &str, data: &[u8]) -> Vec<u8> {
    // A string always serializes.
    let message_type = serde_json::to_string(message_type).unwrap_or_default();
    let mut body = Vec::with_capacity(data.len() + id.len() + message_type.len() + 32);
    body.extend_from_slice(b"{\"id\":\"");
    body.extend_from_slice(id.as_bytes());
    body.extend_from_slice(b"\",\"type\":");
    body.extend_from_slice(message_type.as_bytes());
    body.extend_from_slice(b",\"data\":");
    body.extend_from_slice(data);
    body.push(b'}');
    body
}

/// What a receiver answered: the status, the headers and the body up to the endpoint's cap.
struct Answered {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
    /// Why the rest of the body could not be read, if it could not.
    unread: Option<reqwest::Error>,
}

impl Inner {
    fn send_error(&self, error: reqwest::Error) -> WebhookError {
        if let Some(blocked) = find_source::<BlockedHost>(&error) {
            return WebhookError::BlockedAddress {
                url: self.shown_url.clone(),
                host: blocked.host.clone(),
                addresses: blocked.addresses.clone(),
            };
        }
        // The URL is in our own message already, and this way never with its password.
        let source = error.without_url();
        let url = self.shown_url.clone();
        if source.is_connect() {
            WebhookError::Connect { url, source }
        } else if source.is_timeout() {
            WebhookError::Timeout {
                url,
                timeout: self.client.timeout(),
                source: Box::new(source),
            }
        } else {
            WebhookError::Transport { url, source }
        }
    }
}

impl fmt::Debug for WebhookEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        let header_names: Vec<&str> = inner.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("WebhookEndpoint")
            .field("url", &inner.shown_url)
            .field("secrets", &inner.secrets.len())
            .field("extra_headers", &header_names)
            .field("allowed_addresses", &inner.allowed)
            .field("timeout", &inner.client.timeout())
            .field("connect_timeout", &inner.client.connect_timeout())
            .field("max_response_body", &inner.max_response_body)
            .field("max_retry_after", &inner.max_retry_after)
            .finish()
    }
}

impl WebhookEndpointBuilder {
    /// Adds a signing secret. Give several while rotating keys: each delivery carries one `v1,`
    /// signature per secret, and the receiver accepts any it knows.
    pub fn secret(mut self, secret: WebhookSecret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// The limit on one whole request, from connecting to reading the answer (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The limit on establishing a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Adds a header sent with every delivery, e.g. an API key the receiver asks for. The
    /// value is never shown by `Debug` or in errors.
    ///
    /// The headers the endpoint sets itself (every `webhook-*` header and the body's framing:
    /// `content-type`, `content-length`, `host`, ...) are refused by
    /// [`build`](WebhookEndpointBuilder::build). These headers win over a message's headers of the
    /// same name.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Allows delivering to `address` although it is special-purpose (loopback, private, ...),
    /// for a receiver inside a trusted network. Opens exactly that address; an IPv4-mapped
    /// IPv6 address counts as its IPv4 address.
    pub fn allow_address(mut self, address: IpAddr) -> Self {
        self.allowed.push(address);
        self
    }

    /// How much of an answer's body is read, at most (default 64 KiB); the rest is never
    /// downloaded.
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// The longest `Retry-After` honoured (default 1 hour); longer requests are shortened to it.
    pub fn max_retry_after(mut self, delay: Duration) -> Self {
        self.max_retry_after = delay;
        self
    }

    /// Checks the configuration and sets up how the endpoint's HTTP clients are made (one is
    /// built here, to fail now rather than at the first delivery).
    ///
    /// Fails on a URL that does not parse or is not `http`/`https`, without any secret, with a
    /// reserved or invalid extra header, or when the client cannot be built.
    pub fn build(self) -> Result<WebhookEndpoint, WebhookError> {
        let (url, literal_ip, shown_url) = parse_url(&self.url)?;
        if self.secrets.is_empty() {
            return Err(WebhookError::NoSecret { url: shown_url });
        }
        let headers = extra_headers(&self.headers)?;

        let client = ClientSettings::new(
            self.timeout,
            self.connect_timeout,
            Arc::new(AddressGuard::new(&self.allowed)),
            USER_AGENT,
        )
        .map_err(|source| WebhookError::Client {
            url: shown_url.clone(),
            source: source.without_url(),
        })?;

        Ok(WebhookEndpoint {
            inner: Arc::new(Inner {
                url,
                shown_url,
                literal_ip,
                secrets: self.secrets,
                headers,
                allowed: self.allowed,
                client,
                max_response_body: self.max_response_body,
                max_retry_after: self.max_retry_after,
            }),
        })
    }
}

impl fmt::Debug for WebhookEndpointBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown_url = Url::parse(&self.url)
            .map(|url| redact(&url))
            .unwrap_or_else(|_| "<invalid URL>".into());
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("WebhookEndpointBuilder")
            .field("url", &shown_url)
            .field("secrets", &self.secrets.len())
            .field("extra_headers", &header_names)
            .field("allowed_addresses", &self.allowed)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_response_body", &self.max_response_body)
            .field("max_retry_after", &self.max_retry_after)
            .finish()
    }
}

/// A receiver's URL: `http` or `https` with a host; the host as an address when it is one, and
/// the URL as errors and logs show it (without its password).
fn parse_url(url: &str) -> Result<(Url, Option<IpAddr>, String), WebhookError> {
    let url = Url::parse(url).map_err(|error| WebhookError::InvalidUrl {
        reason: error.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(WebhookError::UnsupportedScheme {
            scheme: url.scheme().to_owned(),
        });
    }
    let Some(host) = url.host_str() else {
        return Err(WebhookError::InvalidUrl {
            reason: "it has no host".into(),
        });
    };
    let literal_ip = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let shown_url = redact(&url);
    Ok((url, literal_ip, shown_url))
}

/// Checks a receiver's URL before it is stored (a subscription a customer types): it must be
/// `https` (or `http` when `allow_http`), and its host must not be, or resolve to, an address
/// the guard refuses ([`is_special_purpose`](super::is_special_purpose)) unless it is one of
/// `allowed`. The guard checks again at every connection; a name that resolves to nothing now
/// is refused.
pub fn check_receiver_url(
    url: &str,
    allow_http: bool,
    allowed: &[IpAddr],
) -> Result<(), WebhookError> {
    let parsed = Url::parse(url).map_err(|error| WebhookError::InvalidUrl {
        reason: error.to_string(),
    })?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => {
            return Err(WebhookError::InvalidUrl {
                reason: "it is `http://`: deliveries would travel unencrypted; use `https://` \
                         or allow `http` for this receiver explicitly"
                    .into(),
            })
        }
        scheme => {
            return Err(WebhookError::UnsupportedScheme {
                scheme: scheme.to_owned(),
            })
        }
    }
    let Some(host) = parsed.host_str() else {
        return Err(WebhookError::InvalidUrl {
            reason: "it has no host".into(),
        });
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            use std::net::ToSocketAddrs as _;
            let port = parsed.port_or_known_default().unwrap_or(443);
            (host, port)
                .to_socket_addrs()
                .map_err(|error| WebhookError::InvalidUrl {
                    reason: format!("its host `{host}` does not resolve: {error}"),
                })?
                .map(|address| address.ip())
                .collect()
        }
    };
    let guard = AddressGuard::new(allowed);
    let refused: Vec<IpAddr> = addresses
        .iter()
        .copied()
        .filter(|ip| !guard.permits(*ip))
        .collect();
    if !refused.is_empty() {
        return Err(WebhookError::BlockedAddress {
            url: redact(&parsed),
            host: host.to_owned(),
            addresses: refused,
        });
    }
    Ok(())
}

/// What a receiver answered to [`WebhookEndpoint::post`].
pub struct WebhookResponse {
    url: String,
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
    retry_after: Option<Duration>,
}

impl WebhookResponse {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The start of the body, up to the endpoint's
    /// [`max_response_body`](WebhookEndpointBuilder::max_response_body).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The receiver's `Retry-After` (seconds or an HTTP date), clamped to the endpoint's
    /// maximum; only read for the retryable statuses 408, 425, 429 and 5xx.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The response itself if it is 2xx; otherwise a [`WebhookError::Redirect`] for 3xx, or a
    /// [`WebhookError::Status`] with an excerpt of the body.
    pub fn error_for_status(self) -> Result<Self, WebhookError> {
        match self.status {
            200..=299 => Ok(self),
            300..=399 => Err(WebhookError::Redirect {
                location: self
                    .headers
                    .get(LOCATION)
                    .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
                    .unwrap_or_default(),
                url: self.url,
                status: self.status,
            }),
            _ => Err(WebhookError::Status {
                excerpt: excerpt(&self.body),
                url: self.url,
                status: self.status,
                retry_after: self.retry_after,
            }),
        }
    }
}

impl fmt::Debug for WebhookResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookResponse")
            .field("url", &self.url)
            .field("status", &self.status)
            .field("body", &excerpt(&self.body))
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

fn extra_headers(given: &[(String, String)]) -> Result<HeaderMap, WebhookError> {
    let mut headers = HeaderMap::new();
    for (name, value) in given {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| WebhookError::InvalidHeader {
                name: name.clone(),
                reason: "it is not a valid header name",
            })?;
        if is_reserved_header(header.as_str()) {
            return Err(WebhookError::ReservedHeader {
                name: header.as_str().to_owned(),
            });
        }
        let mut value = HeaderValue::from_str(value).map_err(|_| WebhookError::InvalidHeader {
            name: name.clone(),
            reason: "its value contains characters not allowed in a header, such as newlines",
        })?;
        value.set_sensitive(true);
        headers.append(header, value);
    }
    Ok(headers)
}

/// A message's headers as HTTP headers. Stores check them when reading (see
/// [`Headers::from_json`]); what reached here anyway is refused, not sent.
fn header_map(headers: &Headers) -> Result<HeaderMap, WebhookError> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter() {
        if is_reserved_header(name) {
            return Err(WebhookError::ReservedHeader {
                name: name.to_owned(),
            });
        }
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| WebhookError::InvalidHeader {
                name: name.to_owned(),
                reason: "it is not a valid header name",
            })?;
        let value = HeaderValue::from_str(value).map_err(|_| WebhookError::InvalidHeader {
            name: name.to_owned(),
            reason: "its value contains characters not allowed in a header",
        })?;
        map.insert(header, value);
    }
    Ok(map)
}

/// The URL for errors and logs: scheme, host and port only. Credentials, and the tokens some
/// services put in the path or query (`/services/T0/B0/XXXX`, `?token=`), are secrets too.
fn redact(url: &Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or("?"));
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    if url.path() != "/" || url.query().is_some() {
        shown.push_str("/…");
    }
    shown
}

fn find_source<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `Retry-After` as delta seconds or an HTTP date (a date in the past means now).
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) {
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The start of a body for an error message: lossily decoded, on one line, about 200
/// characters.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut shown: String = text
        .chars()
        .take(EXCERPT_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(EXCERPT_CHARS).is_some() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    //! What needs no receiver, or the endpoint's private parts; deliveries to a real receiver
    //! are tested in the workspace's `tests/tests/webhook_endpoint.rs`.
    use super::*;
    use outbox_core::FailureKind;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn secret() -> WebhookSecret {
        WebhookSecret::parse(SECRET).unwrap()
    }

    #[test]
    fn bad_configuration_is_refused_at_build() {
        let build = |builder: WebhookEndpointBuilder| builder.build().unwrap_err();
        let base = || WebhookEndpoint::builder("https://hooks.example/in").secret(secret());
        for name in [
            "webhook-id",
            "webhook-signature",
            "webhook-other",
            "content-type",
            "host",
        ] {
            let err = build(base().header(name.to_ascii_uppercase(), "x"));
            assert!(
                matches!(&err, WebhookError::ReservedHeader { name: refused } if refused == name),
                "{err}"
            );
        }
        let err = build(base().header("x-api-key", "line\nbreak-secret"));
        assert!(matches!(err, WebhookError::InvalidHeader { .. }), "{err}");
        assert!(!err.to_string().contains("break-secret"), "{err}");
        let err = build(base().header("bad header", "x"));
        assert!(matches!(err, WebhookError::InvalidHeader { .. }), "{err}");

        let err = build(WebhookEndpoint::builder("https://hooks.example/in"));
        assert!(matches!(err, WebhookError::NoSecret { .. }), "{err}");
        let err = build(WebhookEndpoint::builder("hooks.example/in").secret(secret()));
        assert!(matches!(err, WebhookError::InvalidUrl { .. }), "{err}");
        let err = build(WebhookEndpoint::builder("ftp://hooks.example/in").secret(secret()));
        assert!(
            matches!(&err, WebhookError::UnsupportedScheme { scheme } if scheme == "ftp"),
            "{err}"
        );
        assert_eq!(err.into_delivery_error().kind(), FailureKind::Permanent);
    }

    #[test]
    fn debug_and_errors_show_no_secrets() {
        let builder = WebhookEndpoint::builder("http://user:hunter2@hooks.example/in")
            .secret(secret())
            .header("authorization", "Bearer top-secret-token");
        let shown_builder = format!("{builder:?}");
        let endpoint = builder.build().unwrap();
        let shown = format!("{endpoint:?}");
        for shown in [&shown_builder, &shown] {
            assert!(shown.contains("hooks.example"), "{shown}");
            assert!(shown.contains("authorization"), "{shown}");
            for secret in ["top-secret-token", "hunter2", "C2FV", "whsec_"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
        }
        assert_eq!(endpoint.url().password(), Some("hunter2"));
        assert_eq!(endpoint.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(endpoint.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);

        let err = endpoint.post("bad\nid", b"{}").unwrap_err();
        assert!(matches!(err, WebhookError::InvalidHeader { .. }), "{err}");
        let err = WebhookError::Status {
            url: redact(endpoint.url()),
            status: 401,
            excerpt: String::new(),
            retry_after: None,
        };
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn endpoints_are_shareable_and_clones_share_the_client() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<WebhookEndpoint>();
        let endpoint = WebhookEndpoint::builder("https://hooks.example/in")
            .secret(secret())
            .build()
            .unwrap();
        let clone = endpoint.clone();
        assert!(Arc::ptr_eq(&endpoint.inner, &clone.inner));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        let delay = parse_retry_after(&later, now).unwrap();
        assert!(
            delay > Duration::from_secs(28) && delay <= Duration::from_secs(30),
            "{delay:?}"
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn excerpts_are_short_and_on_one_line() {
        assert_eq!(excerpt(b"  oops\r\nsorry \n"), "oops  sorry");
        assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
        let long = "é".repeat(300);
        let shown = excerpt(long.as_bytes());
        assert_eq!(shown.chars().count(), EXCERPT_CHARS + 1);
        assert!(shown.ends_with('…'));
    }
}
