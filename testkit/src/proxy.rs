//! A TCP proxy on 127.0.0.1 that a test can make stop forwarding, in both directions, while
//! keeping every connection open: a database connection whose peer vanished without a word
//! (a half-open connection, a network partition), where every call waits for an answer that
//! never comes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The proxy: forwards connections to its target until [`stall`](Proxy::stall).
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    stalled: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let stalled = Arc::new(AtomicBool::new(false));
        let stopping = Arc::new(AtomicBool::new(false));
        let (flag, stop) = (Arc::clone(&stalled), Arc::clone(&stopping));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if let Ok(server) = TcpStream::connect(target) {
                            pipe(&client, &server, &flag, &stop);
                            pipe(&server, &client, &flag, &stop);
                        }
                    }
                    Err(error) if error.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => return,
                }
            }
        });
        Proxy {
            addr,
            stalled,
            stopping,
        }
    }

    /// Where to connect to reach the target through the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding, in both directions, on every connection; nothing is closed.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn resume(&self) {
        self.stalled.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on a thread of its own while not stalled; holds what it read while
/// stalled.
fn pipe(from: &TcpStream, to: &TcpStream, stalled: &Arc<AtomicBool>, stop: &Arc<AtomicBool>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (stalled, stop) = (Arc::clone(stalled), Arc::clone(stop));
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buffer = [0u8; 16 * 1024];
        while !stop.load(Ordering::Relaxed) {
            if stalled.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    // Read before a stall began: held until it ends, as a lost link would.
                    while stalled.load(Ordering::SeqCst) && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
