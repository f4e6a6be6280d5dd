//! The sender's side: one configured receiver and the signed POSTs to it.

use std::fmt;
use std::io::Read as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::blocking::Client;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::Url;
use serde::Serialize;

use super::error::{is_retryable_status, WebhookError};
use super::guard::{AddressGuard, BlockedHost, GuardedResolver};
use super::secret::WebhookSecret;
use crate::context::Context;
use crate::error::{FailureKind, ProcessError};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024;
const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);
/// How much of a failed answer's body goes into the error, in characters.
const EXCERPT_CHARS: usize = 200;
const USER_AGENT: &str = concat!("outbox-webhook/", env!("CARGO_PKG_VERSION"));

/// Headers the endpoint sets itself (or that only the HTTP client may set).
const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
];

/// One webhook receiver: its URL, signing secrets, timeouts and the HTTP client that talks to
/// it.
///
/// Build it once with [`WebhookEndpoint::builder`] when the application starts and share it
/// (for instance as a [`Resources`](crate::Resources) entry): clones are cheap and share one
/// client, so connections to the receiver are kept alive and reused across deliveries and
/// worker threads.
///
/// Deliveries are signed the [Standard Webhooks](https://www.standardwebhooks.com) way, are not
/// redirected, ignore proxy settings, and by default refuse special-purpose addresses (see
/// [`is_special_purpose`](super::is_special_purpose)) so that a configured URL cannot be used
/// to reach internal services.
///
/// The client is blocking: call it from worker threads (as handlers run), not from inside an
/// async runtime.
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
    guard: Arc<AddressGuard>,
    allowed: Vec<IpAddr>,
    client: Client,
    timeout: Duration,
    connect_timeout: Duration,
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

    /// The receiver's URL.
    pub fn url(&self) -> &Url {
        &self.inner.url
    }

    /// The limit on one whole request, from connecting to reading the answer.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The limit on establishing a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.inner.connect_timeout
    }

    /// Delivers `data` as the message in `ctx`: POSTs the JSON envelope
    /// `{"id": <message id>, "type": <message type>, "data": <data>}`, signed, with the message
    /// id as `webhook-id` (the same on every retry, so the receiver can drop duplicates).
    ///
    /// A 2xx answer is success. Timeouts, connection failures and the statuses 408, 425, 429
    /// and 5xx are retryable failures, carrying the receiver's `Retry-After`; other statuses,
    /// redirects and refused addresses are permanent. See [`WebhookError`].
    pub fn deliver<T: Serialize + ?Sized>(
        &self,
        ctx: &Context<'_>,
        data: &T,
    ) -> Result<(), ProcessError> {
        #[derive(Serialize)]
        struct Envelope<'a, T: ?Sized> {
            id: &'a str,
            #[serde(rename = "type")]
            message_type: &'a str,
            data: &'a T,
        }

        let id = ctx.message_id().to_string();
        let envelope = Envelope {
            id: &id,
            message_type: ctx.message_type(),
            data,
        };
        match serde_json::to_vec(&envelope) {
            Ok(body) => self.send(ctx, &id, body),
            Err(error) => Err(self.failed(ctx, &id, WebhookError::Serialize(error))),
        }
    }

    /// Delivers `body`, JSON the caller made, as is, for the message in `ctx`: like
    /// [`deliver`](WebhookEndpoint::deliver) without the envelope.
    pub fn send_json(&self, ctx: &Context<'_>, body: &[u8]) -> Result<(), ProcessError> {
        let id = ctx.message_id().to_string();
        self.send(ctx, &id, body.to_vec())
    }

    /// POSTs `body` signed with `msg_id` as `webhook-id`, and returns whatever the receiver
    /// answered, without judging the status: use [`WebhookResponse::error_for_status`] for that.
    ///
    /// Errors are those of not getting an answer: a refused address, a timeout, a failed
    /// connection, or a `msg_id` that cannot be a header value.
    pub fn post(&self, msg_id: &str, body: &[u8]) -> Result<WebhookResponse, WebhookError> {
        self.post_owned(msg_id, body.to_vec())
    }

    fn send(&self, ctx: &Context<'_>, id: &str, body: Vec<u8>) -> Result<(), ProcessError> {
        match self
            .post_owned(id, body)
            .and_then(WebhookResponse::error_for_status)
        {
            Ok(_) => Ok(()),
            Err(error) => Err(self.failed(ctx, id, error)),
        }
    }

    fn failed(&self, ctx: &Context<'_>, id: &str, error: WebhookError) -> ProcessError {
        let error = error.into_process_error();
        let attempt = ctx.attempt();
        match error.kind() {
            FailureKind::Retryable => log::info!(
                "webhook delivery of message {id} (attempt {attempt}) failed and will be \
                 retried: {error}"
            ),
            _ => log::warn!(
                "webhook delivery of message {id} (attempt {attempt}) failed permanently: {error}"
            ),
        }
        error
    }

    fn post_owned(&self, msg_id: &str, body: Vec<u8>) -> Result<WebhookResponse, WebhookError> {
        let inner = &*self.inner;
        if let Some(ip) = inner.literal_ip {
            if !inner.guard.permits(ip) {
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
        let timestamp = unix_now();
        let signatures: Vec<String> = inner
            .secrets
            .iter()
            .map(|secret| secret.sign(msg_id, timestamp, &body))
            .collect();

        let started = Instant::now();
        let response = inner
            .client
            .post(inner.url.clone())
            .headers(inner.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp)
            .header("webhook-signature", signatures.join(" "))
            .body(body)
            .send()
            .map_err(|error| inner.send_error(error))?;

        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        let cap = u64::try_from(inner.max_response_body).unwrap_or(u64::MAX);
        // The status is the receiver's verdict; a body cut short only shortens the excerpt.
        if let Err(error) = response.take(cap).read_to_end(&mut body) {
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
                timeout: self.timeout,
                source,
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
            .field("timeout", &inner.timeout)
            .field("connect_timeout", &inner.connect_timeout)
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
    /// The headers the endpoint sets itself (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`, `content-type`, `content-length`, `host`, `transfer-encoding`,
    /// `connection`) are refused by [`build`](WebhookEndpointBuilder::build).
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

    /// Checks the configuration and sets up the endpoint's HTTP client.
    ///
    /// Fails on a URL that does not parse or is not `http`/`https`, without any secret, with a
    /// reserved or invalid extra header, or when the client cannot be built.
    pub fn build(self) -> Result<WebhookEndpoint, WebhookError> {
        let url = Url::parse(&self.url).map_err(|error| WebhookError::InvalidUrl {
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
        if self.secrets.is_empty() {
            return Err(WebhookError::NoSecret { url: shown_url });
        }
        let headers = extra_headers(&self.headers)?;

        let guard = Arc::new(AddressGuard::new(&self.allowed));
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::clone(&guard))))
            .user_agent(USER_AGENT)
            .build()
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
                guard,
                allowed: self.allowed,
                client,
                timeout: self.timeout,
                connect_timeout: self.connect_timeout,
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
        if RESERVED_HEADERS.contains(&header.as_str()) {
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
    use std::io::{BufRead as _, BufReader, ErrorKind, Write as _};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::context::{Delivery, Resources};
    use crate::message::MessageId;
    use crate::webhook::{verify, WebhookHeaders as _, DEFAULT_TOLERANCE};

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const LOCALHOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn secret() -> WebhookSecret {
        WebhookSecret::parse(SECRET).unwrap()
    }

    /// A request as the test server saw it.
    #[derive(Debug)]
    struct Seen {
        request_line: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    enum Reply {
        /// Writes these bytes, then closes.
        Raw(Vec<u8>),
        /// Answers nothing, holding the connection open this long.
        Silent(Duration),
        /// Closes the connection without answering.
        Close,
        /// A 500 announcing and streaming a body of this many bytes.
        Huge(usize),
    }

    fn reply(status_line: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut text = format!(
            "HTTP/1.1 {status_line}\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        Reply::Raw(text.into_bytes())
    }

    struct Server {
        addr: SocketAddr,
        seen: mpsc::Receiver<Seen>,
    }

    impl Server {
        fn url(&self) -> String {
            format!("http://{}/hook", self.addr)
        }

        fn next(&self) -> Seen {
            self.seen.recv_timeout(Duration::from_secs(5)).unwrap()
        }
    }

    /// A one-connection-per-reply HTTP server on 127.0.0.1 that plays `replies` in order, then
    /// stops; it also stops by itself when no connection comes within 10 s.
    fn serve(replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let (sender, seen) = mpsc::channel();
        thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            for reply in replies {
                let Some(mut stream) = accept_before(&listener, deadline) else {
                    return;
                };
                let Some(request) = read_request(&stream) else {
                    return;
                };
                if sender.send(request).is_err() {
                    return;
                }
                match reply {
                    Reply::Raw(bytes) => {
                        let _ = stream.write_all(&bytes);
                    }
                    Reply::Silent(hold) => thread::sleep(hold),
                    Reply::Close => {}
                    Reply::Huge(len) => {
                        let head = format!(
                            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {len}\r\n\r\n"
                        );
                        let chunk = vec![b'x'; 64 * 1024];
                        let mut written = 0;
                        if stream.write_all(head.as_bytes()).is_ok() {
                            while written < len && stream.write_all(&chunk).is_ok() {
                                written += chunk.len();
                            }
                        }
                    }
                }
            }
        });
        Server { addr, seen }
    }

    fn accept_before(listener: &TcpListener, deadline: Instant) -> Option<TcpStream> {
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).ok()?;
                    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                    stream
                        .set_write_timeout(Some(Duration::from_secs(5)))
                        .ok()?;
                    return Some(stream);
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return None,
            }
        }
        None
    }

    fn read_request(stream: &TcpStream) -> Option<Seen> {
        let mut reader = BufReader::new(stream);
        let mut request_line = String::new();
        reader.read_line(&mut request_line).ok()?;
        let mut headers = Vec::new();
        for _ in 0..100 {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':')?;
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        std::io::Read::read_exact(&mut reader, &mut body).ok()?;
        Some(Seen {
            request_line: request_line.trim_end().to_owned(),
            headers,
            body,
        })
    }

    fn delivery() -> Delivery {
        Delivery {
            message_id: MessageId::new(),
            message_type: "order.shipped".into(),
            attempt: 1,
        }
    }

    fn to(server: &Server) -> WebhookEndpointBuilder {
        WebhookEndpoint::builder(server.url())
            .secret(secret())
            .allow_address(LOCALHOST)
    }

    fn deliver_to(endpoint: &WebhookEndpoint) -> Result<(), ProcessError> {
        let delivery = delivery();
        let resources = Resources::new();
        endpoint.deliver(
            &Context::new(&delivery, &resources),
            &serde_json::json!({"order_id": 7}),
        )
    }

    /// Whether a connection is waiting on `listener` (nothing ever accepts from it).
    fn was_dialled(listener: &TcpListener) -> bool {
        listener.set_nonblocking(true).unwrap();
        match listener.accept() {
            Ok(_) => true,
            Err(error) if error.kind() == ErrorKind::WouldBlock => false,
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn delivers_a_signed_envelope_the_receiver_can_verify() {
        let server = serve(vec![
            reply("200 OK", &[], "thanks"),
            reply("204 No Content", &[], ""),
        ]);
        let rotated = WebhookSecret::from_bytes(*b"the key being rotated out");
        let endpoint = to(&server)
            .secret(rotated.clone())
            .header("X-Tenant", "acme")
            .build()
            .unwrap();
        let delivery = delivery();
        let resources = Resources::new();
        let ctx = Context::new(&delivery, &resources);

        endpoint
            .deliver(&ctx, &serde_json::json!({"order_id": 7}))
            .unwrap();
        let seen = server.next();
        assert_eq!(seen.request_line, "POST /hook HTTP/1.1");
        let verified = verify(&[secret()], &seen.headers, &seen.body, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(verified.id, delivery.message_id.to_string());
        // Each secret signs, so a receiver that only knows the second one accepts too.
        assert!(verify(&[rotated], &seen.headers, &seen.body, DEFAULT_TOLERANCE).is_ok());
        assert_eq!(
            seen.headers
                .header("webhook-signature")
                .unwrap()
                .matches("v1,")
                .count(),
            2
        );
        assert_eq!(
            seen.headers.header("content-type"),
            Some("application/json")
        );
        assert_eq!(seen.headers.header("x-tenant"), Some("acme"));
        let envelope: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(
            envelope,
            serde_json::json!({
                "id": delivery.message_id.to_string(),
                "type": "order.shipped",
                "data": {"order_id": 7},
            })
        );

        endpoint.send_json(&ctx, br#"{"made":"by hand"}"#).unwrap();
        let seen = server.next();
        assert_eq!(seen.body, br#"{"made":"by hand"}"#);
        let again = verify(&[secret()], &seen.headers, &seen.body, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(
            again.id, verified.id,
            "the webhook-id is the message's stable id"
        );
    }

    #[test]
    fn server_errors_are_retryable_with_status_and_excerpt() {
        let server = serve(vec![reply(
            "500 Internal Server Error",
            &[],
            "database\nis down",
        )]);
        let endpoint = to(&server).build().unwrap();
        let err = deliver_to(&endpoint).unwrap_err();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(
            err.reason(),
            format!(
                "webhook http://{}/… answered 500 Internal Server Error: database is down",
                server.addr
            )
        );
        assert_eq!(err.retry_after(), None);
    }

    #[test]
    fn retry_after_is_honoured_and_clamped() {
        let server = serve(vec![
            reply("429 Too Many Requests", &[("Retry-After", "2")], ""),
            reply("503 Service Unavailable", &[("Retry-After", "999999")], ""),
        ]);
        let endpoint = to(&server)
            .max_retry_after(Duration::from_secs(60))
            .build()
            .unwrap();
        let err = deliver_to(&endpoint).unwrap_err();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
        assert!(err.reason().contains("429 Too Many Requests"), "{err}");
        let err = deliver_to(&endpoint).unwrap_err();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
    }

    #[test]
    fn client_errors_are_permanent() {
        let server = serve(vec![
            reply("410 Gone", &[], "no such hook"),
            reply("400 Bad Request", &[("Retry-After", "5")], ""),
        ]);
        let endpoint = to(&server).build().unwrap();
        let gone = deliver_to(&endpoint).unwrap_err();
        assert_eq!(gone.kind(), FailureKind::Permanent);
        assert!(gone.reason().ends_with("410 Gone: no such hook"), "{gone}");
        let bad = deliver_to(&endpoint).unwrap_err();
        assert_eq!(bad.kind(), FailureKind::Permanent);
        assert!(bad.reason().contains("400 Bad Request"), "{bad}");
        assert_eq!(bad.retry_after(), None);
    }

    #[test]
    fn redirects_are_permanent_and_not_followed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let elsewhere = format!("http://{}/moved", listener.local_addr().unwrap());
        let server = serve(vec![
            reply("308 Permanent Redirect", &[("Location", &elsewhere)], ""),
            reply("200 OK", &[], ""),
        ]);
        let endpoint = to(&server).build().unwrap();
        let err = deliver_to(&endpoint).unwrap_err();
        assert_eq!(err.kind(), FailureKind::Permanent);
        assert!(err.reason().contains("308 Permanent Redirect"), "{err}");
        assert!(err.reason().contains("redirects are not followed"), "{err}");
        assert!(err.reason().contains(&elsewhere), "{err}");
        server.next();
        assert!(
            server.seen.try_recv().is_err(),
            "the server saw a second request"
        );
        assert!(!was_dialled(&listener), "the redirect target was dialled");
    }

    #[test]
    fn a_silent_receiver_times_out_as_retryable() {
        let server = serve(vec![Reply::Silent(Duration::from_secs(3))]);
        let endpoint = to(&server)
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let started = Instant::now();
        let err = deliver_to(&endpoint).unwrap_err();
        let elapsed = started.elapsed();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert!(
            err.reason().contains("did not answer within 300ms"),
            "{err}"
        );
        assert!(
            elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(2),
            "{elapsed:?}"
        );
    }

    #[test]
    fn connection_failures_are_retryable() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", closed.local_addr().unwrap());
        drop(closed);
        let endpoint = WebhookEndpoint::builder(url)
            .secret(secret())
            .allow_address(LOCALHOST)
            .build()
            .unwrap();
        let refused = deliver_to(&endpoint).unwrap_err();
        assert_eq!(refused.kind(), FailureKind::Retryable);
        assert!(
            refused.reason().starts_with("could not connect to webhook"),
            "{refused}"
        );

        let server = serve(vec![Reply::Close]);
        let endpoint = to(&server).build().unwrap();
        let hung_up = deliver_to(&endpoint).unwrap_err();
        assert_eq!(hung_up.kind(), FailureKind::Retryable);
        assert!(
            hung_up.reason().contains(&server.addr.to_string()),
            "{hung_up}"
        );
        assert!(
            !hung_up.reason().contains("/hook"),
            "the path may hold a token: {hung_up}"
        );
    }

    #[test]
    fn a_huge_answer_is_read_only_up_to_the_cap() {
        let server = serve(vec![Reply::Huge(10 * 1024 * 1024)]);
        let endpoint = to(&server).build().unwrap();
        let response = endpoint.post("msg_1", b"{}").unwrap();
        assert_eq!(response.status(), 500);
        assert_eq!(response.body().len(), 64 * 1024);
        let err = response.error_for_status().unwrap_err();
        let WebhookError::Status { excerpt, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(excerpt.chars().count(), 201);
        assert!(excerpt.ends_with('…'));
        assert!(err.into_process_error().reason().len() < 400);
    }

    #[test]
    fn special_purpose_addresses_are_refused_before_connecting() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        for url in [
            format!("http://127.0.0.1:{port}/hook"),
            format!("http://[::ffff:127.0.0.1]:{port}/hook"),
            format!("http://localhost:{port}/hook"),
        ] {
            let endpoint = WebhookEndpoint::builder(&url)
                .secret(secret())
                .build()
                .unwrap();
            let err = deliver_to(&endpoint).unwrap_err();
            assert_eq!(err.kind(), FailureKind::Permanent, "{url}: {err}");
            assert!(err.reason().contains("allow_address"), "{url}: {err}");
            let err = endpoint.post("msg_1", b"{}").unwrap_err();
            assert!(
                matches!(err, WebhookError::BlockedAddress { ref addresses, .. }
                    if addresses.iter().all(|ip| ip.to_canonical().is_loopback())),
                "{url}: {err}"
            );
        }
        assert!(
            !was_dialled(&listener),
            "a refused address was connected to"
        );
        let err = WebhookEndpoint::builder(format!("http://localhost:{port}/hook"))
            .secret(secret())
            .build()
            .unwrap()
            .post("msg_1", b"{}")
            .unwrap_err();
        assert!(err.to_string().contains("host `localhost`"), "{err}");
    }

    #[test]
    fn an_allowed_address_is_reachable_by_name_too() {
        let server = serve(vec![reply("200 OK", &[], "")]);
        let url = format!("http://localhost:{}/hook", server.addr.port());
        let endpoint = WebhookEndpoint::builder(url)
            .secret(secret())
            .allow_address(LOCALHOST)
            .build()
            .unwrap();
        deliver_to(&endpoint).unwrap();
        assert!(server.next().request_line.starts_with("POST /hook"));
    }

    #[test]
    fn bad_configuration_is_refused_at_build() {
        let build = |builder: WebhookEndpointBuilder| builder.build().unwrap_err();
        let base = || WebhookEndpoint::builder("https://hooks.example/in").secret(secret());
        for name in RESERVED_HEADERS {
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
        assert_eq!(err.failure_kind(), FailureKind::Permanent);
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
