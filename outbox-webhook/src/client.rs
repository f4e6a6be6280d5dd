//! The HTTP clients an endpoint sends through: one per thread that sends, each on a small
//! runtime of that thread's own, so that a request is written and its answer read by the
//! thread that asked, with no hand-over to another thread and back.
//!
//! Why not one client for all threads: a blocking client hands every request to its runtime
//! thread and waits to be woken with the answer, and on a busy worker that hand-over cost more
//! CPU than the database's part of a delivery. An async client's connections, in turn, are
//! tasks of the runtime that opened them: a connection opened on another thread's runtime
//! makes progress only while that thread polls it, so a client is never shared between
//! runtimes. One client per thread and endpoint configuration keeps every connection with the
//! thread that uses it, alive and reused between its deliveries.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, Weak};
use std::time::Duration;

use reqwest::Client;
use tokio::runtime::Runtime;

use crate::guard::{AddressGuard, GuardedResolver};

/// How the clients of an endpoint (and of the endpoints made from it with `to_url`) are made.
pub(crate) struct ClientSettings {
    timeout: Duration,
    connect_timeout: Duration,
    guard: Arc<AddressGuard>,
    user_agent: &'static str,
}

/// Why this thread could not send a request.
#[derive(Debug)]
pub(crate) enum Unsent {
    /// The thread's runtime could not be set up (the process is out of file descriptors, say).
    Runtime(std::io::Error),
    /// The client could not be built.
    Client(reqwest::Error),
}

impl ClientSettings {
    /// Settings whose client is known to build: one is built and dropped here, so that a
    /// configuration the client refuses fails when the endpoint is built, not at its first
    /// delivery.
    pub fn new(
        timeout: Duration,
        connect_timeout: Duration,
        guard: Arc<AddressGuard>,
        user_agent: &'static str,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let settings = ClientSettings {
            timeout,
            connect_timeout,
            guard,
            user_agent,
        };
        settings.client()?;
        Ok(Arc::new(settings))
    }

    fn client(&self) -> Result<Client, reqwest::Error> {
        Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::clone(&self.guard))))
            .user_agent(self.user_agent)
            .build()
    }

    /// Runs `exchange` to its end on this thread, with this thread's client of these settings.
    ///
    /// Blocks the thread: call it where blocking is allowed (a worker's handler thread, a
    /// thread of an async runtime's blocking pool), never from async code.
    pub fn run<F: Future>(
        self: &Arc<Self>,
        exchange: impl FnOnce(Client) -> F,
    ) -> Result<F::Output, Unsent> {
        let (runtime, client) = THIS_THREAD.with(|clients| clients.borrow_mut().get(self))?;
        runtime.block_on(notice_closed_connections());
        Ok(runtime.block_on(exchange(client)))
    }
}

/// Lets the runtime take in what happened while the thread was away from it: a receiver that
/// closed a kept-alive connection between two deliveries (it restarted, or its idle timeout is
/// shorter than the client's). The connection's task reads the close only when the runtime
/// runs, and until then the pool would hand the dead connection to the next request, which
/// would fail as if the receiver had. Yielding twice runs the runtime's I/O driver once and
/// then the tasks it woke; a test closes connections between deliveries and checks each next
/// one goes through at its first try.
async fn notice_closed_connections() {
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
}

/// This thread's runtime and its clients, each with the settings it was made from.
#[derive(Default)]
struct ThreadClients {
    // Dropped first, when the thread ends: their connections are tasks of the runtime.
    clients: Vec<(Weak<ClientSettings>, Client)>,
    runtime: Option<Rc<Runtime>>,
}

thread_local! {
    static THIS_THREAD: RefCell<ThreadClients> = RefCell::default();
}

impl ThreadClients {
    fn get(&mut self, settings: &Arc<ClientSettings>) -> Result<(Rc<Runtime>, Client), Unsent> {
        let runtime = match &self.runtime {
            Some(runtime) => Rc::clone(runtime),
            None => {
                let runtime = Rc::new(
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(Unsent::Runtime)?,
                );
                self.runtime = Some(Rc::clone(&runtime));
                runtime
            }
        };
        let wanted = Arc::downgrade(settings);
        if let Some((_, client)) = self
            .clients
            .iter()
            .find(|(made_from, _)| Weak::ptr_eq(made_from, &wanted))
        {
            return Ok((runtime, client.clone()));
        }
        // The endpoints of settings no longer used are gone: so are their connections.
        self.clients
            .retain(|(made_from, _)| made_from.strong_count() > 0);
        let client = settings.client().map_err(Unsent::Client)?;
        self.clients.push((wanted, client.clone()));
        Ok((runtime, client))
    }
}
