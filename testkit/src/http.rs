//! A real HTTP/1.1 receiver on 127.0.0.1: answers as a test scripts it (a status, a hang, a
//! reset, a trickle, a redirect…), keeps every request for the test to inspect, and counts
//! webhook ids (deliveries, duplicates, arrival times) cheaply enough for the benchmarks.
//!
//! One thread per keep-alive connection; requests are parsed from a buffer with just enough
//! HTTP for `Content-Length`, so the receiver itself costs little next to the client it
//! measures.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest request the receiver reads; a larger one closes the connection.
const MAX_REQUEST: usize = 64 << 20;

/// How often an idle connection checks whether the receiver is stopping.
const STOP_CHECK: Duration = Duration::from_millis(200);

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request line's method.
    pub method: String,
    /// The request line's path.
    pub path: String,
    /// Headers in arrival order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// When it had arrived whole.
    pub at: Instant,
    /// The status the receiver answered with (0: it hung or reset without one).
    pub answered: u16,
}

impl Request {
    /// The value of header `name` (give it lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "the request body is not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `webhook-id` header.
    pub fn webhook_id(&self) -> Option<&str> {
        self.header("webhook-id")
    }
}

/// How to answer one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A status with extra headers and a body; the connection stays open.
    Status(u16, Vec<(String, String)>, Vec<u8>),
    /// These bytes as they are, then close.
    Raw(Vec<u8>),
    /// Say nothing for this long, then close.
    Hang(Duration),
    /// Close the connection without answering.
    Reset,
    /// Start a 200 answer (the work is done), then close halfway through its body.
    Truncated,
    /// A 200 answer's header lines one at a time, this far apart.
    TrickleHead(Duration),
    /// A 200 answer whose body of `bytes` bytes comes one byte every `every`: a receiver that
    /// never stalls long enough for a per-read timeout, yet takes `bytes × every` to answer.
    TrickleBody {
        /// The pause before each byte.
        every: Duration,
        /// The body's length.
        bytes: usize,
    },
    /// A status whose body of `len` bytes is streamed as fast as the client reads.
    Huge {
        /// The status.
        status: u16,
        /// The body's length.
        len: usize,
    },
}

impl Reply {
    /// A bare status.
    pub fn status(code: u16) -> Reply {
        Reply::Status(code, Vec::new(), Vec::new())
    }

    /// A status with one extra header.
    pub fn with_header(code: u16, name: &str, value: &str) -> Reply {
        Reply::Status(code, vec![(name.into(), value.into())], Vec::new())
    }

    /// A status with a text body.
    pub fn with_body(code: u16, body: &str) -> Reply {
        Reply::Status(code, Vec::new(), body.as_bytes().to_vec())
    }

    /// The status a client sees first, for the request log (0: none).
    fn answered(&self) -> u16 {
        match self {
            Reply::Status(code, _, _) | Reply::Huge { status: code, .. } => *code,
            Reply::Raw(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0),
            // A receiver that sent a 2xx status line has done its work, even if the rest of
            // the answer is then cut short or slow.
            Reply::Truncated | Reply::TrickleHead(_) => 200,
            // An answer that takes longer than any sender waits never completes: the sender
            // retries, so it is no delivery.
            Reply::TrickleBody { .. } | Reply::Hang(_) | Reply::Reset => 0,
        }
    }
}

type Behaviour = Box<dyn FnMut(&Request, usize) -> Reply + Send>;

#[derive(Default)]
struct Book {
    requests: Vec<Request>,
    count: usize,
    seen: HashSet<u128>,
    duplicates: u64,
    without_id: u64,
    times: Vec<(u128, Instant)>,
}

struct State {
    book: Mutex<Book>,
    behaviour: Mutex<Option<Behaviour>>,
    keep_requests: AtomicBool,
    record_times: AtomicBool,
    delay_us: AtomicU64,
    stop: AtomicBool,
    /// Bumped by [`Receiver::restart`]: connections opened before it close.
    generation: AtomicU64,
    /// Connections accepted so far.
    connections: AtomicU64,
}

impl State {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The receiver; it stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Receiver {
    /// A receiver that answers 200 to everything and keeps every request.
    pub fn ok() -> Receiver {
        Self::launch(None, true)
    }

    /// A receiver whose answer to the n-th request (from 0) is `behaviour(request, n)`. The
    /// behaviour runs under the receiver's lock, one request at a time: a slow receiver is
    /// [`set_delay`](Receiver::set_delay), which waits on each connection's own thread.
    pub fn start(behaviour: impl FnMut(&Request, usize) -> Reply + Send + 'static) -> Receiver {
        Self::launch(Some(Box::new(behaviour)), true)
    }

    /// A receiver for load: answers 200 (after [`set_delay`](Receiver::set_delay)), counts
    /// webhook ids, and keeps no requests.
    pub fn counting() -> Receiver {
        Self::launch(None, false)
    }

    fn launch(behaviour: Option<Behaviour>, keep_requests: bool) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        let addr = listener.local_addr().expect("the bound address");
        let state = Arc::new(State {
            book: Mutex::new(Book::default()),
            behaviour: Mutex::new(behaviour),
            keep_requests: AtomicBool::new(keep_requests),
            record_times: AtomicBool::new(false),
            delay_us: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let accept_state = Arc::clone(&state);
        let accept = std::thread::Builder::new()
            .name("receiver-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_state.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    accept_state.connections.fetch_add(1, Ordering::SeqCst);
                    let state = Arc::clone(&accept_state);
                    let _ = std::thread::Builder::new()
                        .name("receiver-conn".into())
                        .spawn(move || serve(stream, &state));
                }
            })
            .expect("starting the receiver's thread");
        Receiver {
            addr,
            state,
            accept: Some(accept),
        }
    }

    /// Closes every open connection, as a receiver that restarts does, and goes on accepting
    /// new ones: a client's pooled keep-alive connections go stale. Returns once they closed.
    pub fn restart(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(STOP_CHECK * 2);
    }

    /// Changes how later requests are answered.
    pub fn set_behaviour(&self, behaviour: impl FnMut(&Request, usize) -> Reply + Send + 'static) {
        *self
            .state
            .behaviour
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(behaviour));
    }

    /// Answers each request without a behaviour only after `delay` (a slow receiver).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.state.delay_us.store(us, Ordering::SeqCst);
    }

    /// Whether to keep each webhook id's arrival time (for latencies).
    pub fn record_times(&self, on: bool) {
        self.state.record_times.store(on, Ordering::SeqCst);
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The receiver's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far (none for a [`counting`](Receiver::counting) receiver).
    pub fn requests(&self) -> Vec<Request> {
        self.state.book().requests.clone()
    }

    /// Connections accepted so far: a client that keeps its connections alive opens few.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        self.state.book().count
    }

    /// Distinct webhook ids (UUIDs) received.
    pub fn unique(&self) -> u64 {
        self.state.book().seen.len() as u64
    }

    /// Requests whose webhook id had been received before.
    pub fn duplicates(&self) -> u64 {
        self.state.book().duplicates
    }

    /// Requests without a webhook id that is a UUID.
    pub fn without_id(&self) -> u64 {
        self.state.book().without_id
    }

    /// The (webhook id, arrival) pairs recorded so far, emptied.
    pub fn take_times(&self) -> Vec<(u128, Instant)> {
        std::mem::take(&mut self.state.book().times)
    }

    /// Forgets every request so far.
    pub fn reset(&self) {
        *self.state.book() = Book::default();
    }

    /// Waits until `done(requests)` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&[Request]) -> bool) -> bool {
        crate::eventually(timeout, || done(&self.state.book().requests))
    }

    /// Waits until at least `n` requests arrived and, where the receiver keeps them, are in
    /// [`requests`](Receiver::requests): a request is counted before its answer is decided,
    /// and kept after.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let keep = self.state.keep_requests.load(Ordering::Relaxed);
        crate::eventually(timeout, || {
            let book = self.state.book();
            book.count >= n && (!keep || book.requests.len() >= n)
        })
    }

    /// Waits until `n` distinct webhook ids arrived.
    pub fn wait_unique(&self, n: u64, timeout: Duration) -> bool {
        crate::eventually(timeout, || self.unique() >= n)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// A webhook id (a UUID's 32 hex digits, dashes ignored) as a number.
pub fn parse_uuid(text: &[u8]) -> Option<u128> {
    let mut value: u128 = 0;
    let mut digits = 0;
    for &byte in text {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            b'A'..=b'F' => byte - b'A' + 10,
            b'-' => continue,
            _ => return None,
        };
        value = (value << 4) | u128::from(digit);
        digits += 1;
    }
    (digits == 32).then_some(value)
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// What the fast path needs of a request head: its body's length and webhook id.
#[derive(Clone, Copy)]
struct Head {
    length: usize,
    id: Option<u128>,
}

fn parse_head(head: &[u8]) -> Option<Head> {
    let mut length = 0;
    let mut id = None;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            length = std::str::from_utf8(value).ok()?.parse().ok()?;
        } else if name.eq_ignore_ascii_case(b"webhook-id") {
            id = parse_uuid(value);
        }
    }
    Some(Head { length, id })
}

fn full_request(head: &[u8], body: &[u8], at: Instant) -> Request {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split_whitespace();
    let method = request_line.next().unwrap_or_default().to_owned();
    let path = request_line.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Request {
        method,
        path,
        headers,
        body: body.to_vec(),
        at,
        answered: 0,
    }
}

fn serve(mut stream: TcpStream, state: &State) {
    let generation = state.generation.load(Ordering::SeqCst);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(STOP_CHECK));
    let mut buf = vec![0u8; 16 * 1024];
    let mut filled = 0;
    // The head of the request being read, once found: a large body is not scanned again for
    // it on every read.
    let mut found: Option<(usize, Head)> = None;
    loop {
        if found.is_none() {
            found = find(&buf[..filled], b"\r\n\r\n")
                .and_then(|end| Some((end, parse_head(&buf[..end])?)));
        }
        if let Some((head_end, head)) = found {
            let body_start = head_end + 4;
            let total = body_start + head.length;
            if total > MAX_REQUEST {
                return;
            }
            if filled >= total {
                let reply = answer(state, &buf[..head_end], &buf[body_start..total], &head);
                if !send(&mut stream, reply, state) {
                    return;
                }
                buf.copy_within(total..filled, 0);
                filled -= total;
                found = None;
                continue;
            }
            if total > buf.len() {
                buf.resize(total, 0);
            }
        } else if filled == buf.len() {
            if buf.len() >= MAX_REQUEST {
                return;
            }
            buf.resize(buf.len() * 2, 0);
        }
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return,
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if state.stop.load(Ordering::SeqCst)
                    || state.generation.load(Ordering::SeqCst) != generation
                {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Books the request and decides the answer; `None` is the plain 200 of the fast path.
fn answer(state: &State, head: &[u8], body: &[u8], parsed: &Head) -> Option<Reply> {
    let at = Instant::now();
    let keep = state.keep_requests.load(Ordering::Relaxed);
    let mut behaviour = state
        .behaviour
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let request = (keep || behaviour.is_some()).then(|| full_request(head, body, at));
    let n = {
        let mut book = state.book();
        let n = book.count;
        book.count += 1;
        match parsed.id {
            Some(id) => {
                if !book.seen.insert(id) {
                    book.duplicates += 1;
                }
                if state.record_times.load(Ordering::Relaxed) {
                    book.times.push((id, at));
                }
            }
            None => book.without_id += 1,
        }
        n
    };
    let reply = match (behaviour.as_mut(), &request) {
        (Some(behaviour), Some(request)) => Some(behaviour(request, n)),
        _ => None,
    };
    drop(behaviour);
    if let (true, Some(mut request)) = (keep, request) {
        request.answered = reply.as_ref().map_or(200, Reply::answered);
        state.book().requests.push(request);
    }
    reply
}

/// Writes the answer; whether the connection may serve another request.
fn send(stream: &mut TcpStream, reply: Option<Reply>, state: &State) -> bool {
    let Some(reply) = reply else {
        let delay = state.delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        return stream.write_all(OK).is_ok();
    };
    match reply {
        Reply::Status(code, headers, body) => {
            let mut head = format!("HTTP/1.1 {code} Test\r\ncontent-length: {}\r\n", body.len());
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).is_ok() && stream.write_all(&body).is_ok()
        }
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes);
            let _ = stream.flush();
            let _ = stream.shutdown(Shutdown::Write);
            // Let the client read it all before the socket goes away.
            std::thread::sleep(Duration::from_millis(50));
            false
        }
        Reply::Hang(duration) => {
            let until = Instant::now() + duration;
            while Instant::now() < until && !state.stop.load(Ordering::SeqCst) {
                std::thread::sleep(STOP_CHECK.min(until.saturating_duration_since(Instant::now())));
            }
            let _ = stream.shutdown(Shutdown::Both);
            false
        }
        Reply::Reset => {
            let _ = stream.shutdown(Shutdown::Both);
            false
        }
        Reply::Truncated => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial");
            let _ = stream.flush();
            let _ = stream.shutdown(Shutdown::Both);
            false
        }
        Reply::TrickleHead(delay) => [
            "HTTP/1.1 200 OK\r\n",
            "x-slow-1: a\r\n",
            "x-slow-2: b\r\n",
            "content-length: 0\r\n",
            "\r\n",
        ]
        .into_iter()
        .all(|line| {
            std::thread::sleep(delay);
            stream
                .write_all(line.as_bytes())
                .and_then(|_| stream.flush())
                .is_ok()
        }),
        Reply::TrickleBody { every, bytes } => {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {bytes}\r\n\r\n");
            if stream.write_all(head.as_bytes()).is_err() {
                return false;
            }
            for _ in 0..bytes {
                std::thread::sleep(every);
                if state.stop.load(Ordering::SeqCst)
                    || stream.write_all(b"x").and_then(|_| stream.flush()).is_err()
                {
                    return false;
                }
            }
            true
        }
        Reply::Huge { status, len } => {
            let head = format!("HTTP/1.1 {status} Test\r\ncontent-length: {len}\r\n\r\n");
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0;
            if stream.write_all(head.as_bytes()).is_err() {
                return false;
            }
            while written < len {
                let n = chunk.len().min(len - written);
                if stream.write_all(&chunk[..n]).is_err() {
                    return false;
                }
                written += n;
            }
            true
        }
    }
}

/// Has another implementation of Standard Webhooks (the `standardwebhooks` package for Python,
/// which `scripts/test` installs) verify each of `requests` with `secret`: `Err` names the first
/// it refused, or says what to install when the package is missing (outside CI, which installs
/// it, a missing package fails the test all the same: the promise is about that verifier).
pub fn verify_elsewhere(requests: &[Request], secret: &str) -> Result<usize, String> {
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, path = sys.argv[1], sys.argv[2]
hook = Webhook(secret)
checked = 0
for request in json.load(open(path)):
    hook.verify(request["body"].encode(), request["headers"])
    checked += 1
print(checked)
"#;
    let entries: Vec<serde_json::Value> = requests
        .iter()
        .map(|request| {
            let headers: serde_json::Map<String, serde_json::Value> = request
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
                .collect();
            serde_json::json!({
                "body": String::from_utf8_lossy(&request.body),
                "headers": headers,
            })
        })
        .collect();
    let path = std::env::temp_dir().join(format!(
        "outbox-verify-{}-{}.json",
        std::process::id(),
        NEXT_FILE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, serde_json::Value::Array(entries).to_string())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(secret)
        .arg(&path)
        .output()
        .map_err(|e| format!("running python3: {e}"))?;
    let _ = std::fs::remove_file(&path);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("No module named 'standardwebhooks'") {
            return Err(
                "the Python package `standardwebhooks` is missing: `pip install \
                        standardwebhooks` (scripts/test installs it)"
                    .into(),
            );
        }
        return Err(format!("the other verifier refused a request: {stderr}"));
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("reading the other verifier's count: {e}"))
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    fn post(addr: SocketAddr, id: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        let request = format!(
            "POST /hook HTTP/1.1\r\nhost: x\r\nwebhook-id: {id}\r\nX-Tenant: acme\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn ids_parse_with_and_without_dashes() {
        assert_eq!(
            parse_uuid(b"0190a0b2-7c3d-7e4f-8a5b-6c7d8e9fa0b1"),
            parse_uuid(b"0190a0b27c3d7e4f8a5b6c7d8e9fa0b1")
        );
        assert!(parse_uuid(b"msg_123").is_none());
    }

    #[test]
    fn keeps_requests_counts_ids_and_answers_as_told() {
        let receiver = Receiver::start(|request, n| {
            if request.path == "/teapot" {
                Reply::status(418)
            } else {
                Reply::with_body(if n == 0 { 500 } else { 200 }, "done")
            }
        });
        let id = "0190a0b2-7c3d-7e4f-8a5b-6c7d8e9fa0b1";
        assert!(post(receiver.addr(), id, "{\"a\":1}").starts_with("HTTP/1.1 500"));
        assert!(post(receiver.addr(), id, "{}").starts_with("HTTP/1.1 200"));
        let requests = receiver.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].answered, 500);
        assert_eq!(requests[0].header("x-tenant"), Some("acme"));
        assert_eq!(requests[0].json()["a"], 1);
        assert_eq!(requests[1].webhook_id(), Some(id));
        assert_eq!((receiver.unique(), receiver.duplicates()), (1, 1));
    }

    #[test]
    fn counting_keeps_no_requests_but_counts_them() {
        let receiver = Receiver::counting();
        post(receiver.addr(), "not-a-uuid", "{}");
        post(
            receiver.addr(),
            "0190a0b2-7c3d-7e4f-8a5b-6c7d8e9fa0b1",
            "{}",
        );
        assert!(receiver.wait_for(2, Duration::from_secs(5)));
        assert!(receiver.requests().is_empty());
        assert_eq!((receiver.unique(), receiver.without_id()), (1, 1));
    }
}
