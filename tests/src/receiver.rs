//! A real HTTP/1.1 server on 127.0.0.1 for tests: records every request and answers as the
//! test tells it to (a status, a hang, a reset, a redirect).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request line's method.
    pub method: String,
    /// The request line's path.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
    /// The status the receiver answered with (0: it hung or reset without one).
    pub answered: u16,
}

impl Request {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// How to answer one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A status with extra headers and a body.
    Status(u16, Vec<(String, String)>, Vec<u8>),
    /// Read the request, then say nothing for this long and close.
    Hang(Duration),
    /// Close the connection without answering.
    Reset,
    /// Start a 200 answer (the work is done), then close the connection halfway through its
    /// body.
    Truncated,
    /// Send a 200 answer's header lines one by one, `delay` apart.
    Trickle(Duration),
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
}

type Behaviour = Box<dyn FnMut(&Request, usize) -> Reply + Send>;

struct State {
    requests: Mutex<Vec<Request>>,
    behaviour: Mutex<Behaviour>,
    stop: AtomicBool,
}

/// The server; it stops when dropped.
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
    /// A receiver that answers 200 to everything.
    pub fn ok() -> Receiver {
        Self::start(|_, _| Reply::status(200))
    }

    /// A receiver whose answer to the n-th request (from 0) is `behaviour(request, n)`.
    pub fn start(behaviour: impl FnMut(&Request, usize) -> Reply + Send + 'static) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        let addr = listener.local_addr().expect("the bound address");
        let state = Arc::new(State {
            requests: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Box::new(behaviour)),
            stop: AtomicBool::new(false),
        });
        let accept_state = Arc::clone(&state);
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_state.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = Arc::clone(&accept_state);
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Receiver {
            addr,
            state,
            accept: Some(accept),
        }
    }

    /// Changes how later requests are answered.
    pub fn set_behaviour(&self, behaviour: impl FnMut(&Request, usize) -> Reply + Send + 'static) {
        *self.state.behaviour.lock().unwrap() = Box::new(behaviour);
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until `done(requests)` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&[Request]) -> bool) -> bool {
        let until = Instant::now() + timeout;
        loop {
            if done(&self.state.requests.lock().unwrap()) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until at least `n` requests arrived.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |requests| requests.len() >= n)
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

fn serve(stream: TcpStream, state: &State) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut writer = write_half;
    let mut reader = BufReader::new(stream);
    while !state.stop.load(Ordering::SeqCst) {
        let Some(request) = read_request(&mut reader) else {
            return;
        };
        let reply = {
            let mut requests = state.requests.lock().unwrap();
            let n = requests.len();
            requests.push(request.clone());
            drop(requests);
            let reply = (state.behaviour.lock().unwrap())(&request, n);
            // A receiver that sent a 2xx status line has done its work, even if the rest of
            // the answer is then cut short.
            let answered = match &reply {
                Reply::Status(code, _, _) => *code,
                Reply::Trickle(_) | Reply::Truncated => 200,
                Reply::Hang(_) | Reply::Reset => 0,
            };
            if let Some(logged) = state.requests.lock().unwrap().get_mut(n) {
                logged.answered = answered;
            }
            reply
        };
        match reply {
            Reply::Status(code, headers, body) => {
                let mut head =
                    format!("HTTP/1.1 {code} Test\r\ncontent-length: {}\r\n", body.len());
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                if writer.write_all(head.as_bytes()).is_err() || writer.write_all(&body).is_err() {
                    return;
                }
            }
            Reply::Hang(duration) => {
                std::thread::sleep(duration);
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Reply::Reset => {
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Reply::Truncated => {
                let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial");
                let _ = writer.flush();
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Reply::Trickle(delay) => {
                for line in [
                    "HTTP/1.1 200 OK\r\n",
                    "x-slow-1: a\r\n",
                    "x-slow-2: b\r\n",
                    "content-length: 0\r\n",
                    "\r\n",
                ] {
                    std::thread::sleep(delay);
                    if writer
                        .write_all(line.as_bytes())
                        .and_then(|_| writer.flush())
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim().to_owned();
        if name == "content-length" {
            length = value.parse().ok()?;
        }
        headers.push((name, value));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
        at: Instant::now(),
        answered: 0,
    })
}
