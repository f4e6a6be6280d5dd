//! A minimal, fast HTTP/1.1 receiver on 127.0.0.1 (a thread per keep-alive connection, just
//! enough parsing for `Content-Length` and `webhook-id`) that counts deliveries, duplicates and
//! receive times; and a minimal keep-alive client to measure its own capacity.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{failed, Res, WithContext};

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
const MAX_REQUEST: usize = 1 << 20;

#[derive(Default)]
struct Book {
    seen: HashSet<u128>,
    duplicates: u64,
    without_id: u64,
    times: Vec<(u128, Instant)>,
}

struct Shared {
    stop: AtomicBool,
    delay_us: AtomicU64,
    record_times: AtomicBool,
    requests: AtomicU64,
    book: Mutex<Book>,
}

impl Shared {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The receiver; it stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> Res<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").ctx("binding the receiver's port")?;
        let addr = listener
            .local_addr()
            .ctx("reading the receiver's address")?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            delay_us: AtomicU64::new(0),
            record_times: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            book: Mutex::new(Book::default()),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("receiver-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shared.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = Arc::clone(&accept_shared);
                    let _ = std::thread::Builder::new()
                        .name("receiver-conn".into())
                        .spawn(move || serve(stream, &shared));
                }
            })
            .ctx("starting the receiver")?;
        Ok(Receiver {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// The URL deliveries go to.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// The receiver's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forgets every request so far.
    pub fn reset(&self) {
        *self.shared.book() = Book::default();
        self.shared.requests.store(0, Ordering::SeqCst);
    }

    /// Answers each request only after `delay` (a slow receiver).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(us, Ordering::SeqCst);
    }

    /// Whether to keep each request's webhook id and arrival time (for latencies).
    pub fn record_times(&self, on: bool) {
        self.shared.record_times.store(on, Ordering::SeqCst);
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Distinct webhook ids received.
    pub fn unique(&self) -> u64 {
        self.shared.book().seen.len() as u64
    }

    /// Requests whose webhook id had been received before.
    pub fn duplicates(&self) -> u64 {
        self.shared.book().duplicates
    }

    /// Requests without a readable webhook id.
    pub fn without_id(&self) -> u64 {
        self.shared.book().without_id
    }

    /// The (webhook id, arrival) pairs recorded so far, emptied.
    pub fn take_times(&self) -> Vec<(u128, Instant)> {
        std::mem::take(&mut self.shared.book().times)
    }

    /// Waits until `n` distinct ids arrived or `timeout` passed; returns whether they did.
    pub fn wait_unique(&self, n: u64, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            if self.unique() >= n {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// The webhook id (a UUID's 32 hex digits, dashes ignored) as a number.
pub fn parse_id(text: &[u8]) -> Option<u128> {
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

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The request head's content length and webhook id.
fn parse_head(head: &[u8]) -> Option<(usize, Option<u128>)> {
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
            id = parse_id(value);
        }
    }
    Some((length, id))
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = vec![0u8; 16 * 1024];
    let mut filled = 0;
    loop {
        // A whole request in buf[..filled]?
        let request = find(&buf[..filled], b"\r\n\r\n").and_then(|end| {
            let (length, id) = parse_head(&buf[..end])?;
            Some((end + 4, length, id))
        });
        if let Some((body_start, length, id)) = request {
            let total = body_start + length;
            if total > MAX_REQUEST {
                return;
            }
            if filled >= total {
                record(shared, id);
                let delay = shared.delay_us.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(Duration::from_micros(delay));
                }
                if stream.write_all(RESPONSE).is_err() {
                    return;
                }
                buf.copy_within(total..filled, 0);
                filled -= total;
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
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn record(shared: &Shared, id: Option<u128>) {
    let at = Instant::now();
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let record_times = shared.record_times.load(Ordering::Relaxed);
    let mut book = shared.book();
    match id {
        Some(id) => {
            if !book.seen.insert(id) {
                book.duplicates += 1;
            }
            if record_times {
                book.times.push((id, at));
            }
        }
        None => book.without_id += 1,
    }
}

/// Sends `total` POSTs over `threads` keep-alive connections with a minimal client, each
/// shaped like a signed delivery of `body`; returns requests per second. This is the
/// receiver's own capacity (and the loopback's), not the library's HTTP client's.
pub fn raw_capacity(addr: SocketAddr, threads: usize, total: u64, body: &[u8]) -> Res<f64> {
    let threads = threads.max(1);
    let per_thread = total / threads as u64;
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let body = body.to_vec();
            std::thread::spawn(move || raw_client(addr, t as u64, per_thread, &body))
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| failed("a capacity client panicked"))??;
    }
    Ok((per_thread * threads as u64) as f64 / started.elapsed().as_secs_f64())
}

fn raw_client(addr: SocketAddr, thread: u64, count: u64, body: &[u8]) -> Res<()> {
    let mut stream = TcpStream::connect(addr).ctx("connecting to the receiver")?;
    stream.set_nodelay(true).ctx("setting TCP_NODELAY")?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ctx("setting a read timeout")?;
    let mut answer = [0u8; 1024];
    for n in 0..count {
        // A distinct, UUID-shaped id per request, so the receiver's bookkeeping runs as usual.
        let id = (u128::from(thread) << 96) | u128::from(n) | (1u128 << 127);
        let hex = format!("{id:032x}");
        let head = format!(
            "POST /hook HTTP/1.1\r\nhost: {addr}\r\nuser-agent: outbox-webhook/0.1.0\r\n\
             content-type: application/json\r\nwebhook-id: {}-{}-{}-{}-{}\r\n\
             webhook-timestamp: 1767225600\r\n\
             webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=\r\n\
             accept: */*\r\ncontent-length: {}\r\n\r\n",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..],
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        stream.write_all(&request).ctx("sending a request")?;
        let mut got = 0;
        loop {
            let n = stream.read(&mut answer[got..]).ctx("reading an answer")?;
            if n == 0 {
                return Err(failed("the receiver closed the connection"));
            }
            got += n;
            if find(&answer[..got], b"\r\n\r\n").is_some() {
                break;
            }
            if got == answer.len() {
                return Err(failed("an answer head longer than 1 KiB"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_with_and_without_dashes() {
        assert_eq!(
            parse_id(b"0190a0b2-7c3d-7e4f-8a5b-6c7d8e9fa0b1"),
            parse_id(b"0190a0b27c3d7e4f8a5b6c7d8e9fa0b1")
        );
        assert!(parse_id(b"msg_123").is_none());
    }

    #[test]
    fn counts_deliveries_and_duplicates() -> Res<()> {
        let receiver = Receiver::start()?;
        raw_capacity(receiver.addr(), 2, 10, b"{}")?;
        assert_eq!(receiver.requests(), 10);
        assert_eq!(receiver.unique(), 10);
        raw_capacity(receiver.addr(), 2, 10, b"{}")?;
        assert_eq!(receiver.duplicates(), 10);
        Ok(())
    }
}
