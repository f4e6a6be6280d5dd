//! The destination conformance kit on the Redis stream destination, against a `redis-server`
//! of its own on a loopback port (installed by `scripts/test`; `apt-get install redis-server`).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use outbox_core::testing::destination_kit::{DestinationHarness, Received};
use outbox_example_redis_destination::{RedisStreamDestination, BODY_FIELD};
use redis::Value;

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    listener.local_addr().expect("the bound address").port()
}

/// A `redis-server` that keeps nothing on disk, on `port`, accepting connections; `None` if
/// the port was taken before it could bind it (another test's server, or a connection's local
/// port), seen by the server's exit or by an answer from a server that is not this one.
fn start(port: u16) -> Option<Child> {
    let mut server = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting redis-server");
    let started = Instant::now();
    loop {
        if server.try_wait().expect("watching redis-server").is_some() {
            return None;
        }
        if let Some(pid) = pid_listening(port) {
            if pid == server.id() {
                return Some(server);
            }
            let _ = server.kill();
            let _ = server.wait();
            return None;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process id of the Redis server answering on `port`, if one answers.
fn pid_listening(port: u16) -> Option<u32> {
    TcpStream::connect(("127.0.0.1", port)).ok()?;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut connection = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut connection)
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

struct Redis {
    port: u16,
    server: Mutex<Child>,
}

impl Redis {
    /// A server of its own, if `redis-server` is installed; if not, says how to install it, and
    /// with `CI=true` fails.
    fn new() -> Option<Redis> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            let message = "redis-server is not installed (apt-get install redis-server)";
            assert!(
                std::env::var("CI").map_or(true, |ci| ci != "true"),
                "{message}; CI=true, so this fails instead of skipping"
            );
            eprintln!("SKIPPED: {message}");
            return None;
        }
        // A free port can be taken before the server binds it: then another one.
        for _ in 0..10 {
            let port = free_port();
            if let Some(server) = start(port) {
                return Some(Redis {
                    port,
                    server: Mutex::new(server),
                });
            }
        }
        panic!("redis-server could not bind any of 10 free loopback ports");
    }

    fn to(&self, port: u16) -> RedisStreamDestination {
        let url = format!("redis://127.0.0.1:{port}");
        RedisStreamDestination::new(&url, "events", Duration::from_secs(2)).unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let server = self.server.get_mut().unwrap();
        let _ = server.kill();
        let _ = server.wait();
    }
}

/// A stream entry's fields as text.
fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        other => format!("{other:?}"),
    }
}

impl DestinationHarness for Redis {
    type Destination = RedisStreamDestination;

    fn destination(&self) -> RedisStreamDestination {
        self.to(self.port)
    }

    fn unreachable(&self) -> RedisStreamDestination {
        self.to(free_port())
    }

    fn received(&self) -> Vec<Received> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).unwrap();
        let mut connection = client.get_connection().unwrap();
        let entries: Vec<(String, Vec<Value>)> = redis::cmd("XRANGE")
            .arg("events")
            .arg("-")
            .arg("+")
            .query(&mut connection)
            .unwrap();
        entries
            .into_iter()
            .map(|(_, fields)| {
                let mut received = Received {
                    message_id: String::new(),
                    message_type: String::new(),
                    body: Vec::new(),
                    headers: Vec::new(),
                };
                for pair in fields.chunks(2) {
                    let (name, value) = (text(&pair[0]), text(&pair[1]));
                    match name.as_str() {
                        "outbox-message-id" => received.message_id = value,
                        "outbox-message-type" => received.message_type = value,
                        BODY_FIELD => received.body = value.into_bytes(),
                        _ => received.headers.push((name.to_ascii_lowercase(), value)),
                    }
                }
                received
            })
            .collect()
    }

    fn push_back(&self, _: Duration) -> bool {
        // Redis has no answer that asks a client to wait a while.
        false
    }

    fn restart(&self) {
        let mut server = self.server.lock().unwrap();
        let _ = server.kill();
        let _ = server.wait();
        *server = start(self.port).expect("redis-server restarts on its port");
    }
}

outbox_core::destination_conformance!(optional Redis::new());
