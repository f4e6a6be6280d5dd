//! The HTTP clients an endpoint sends through: one per thread that sends, each on a small
//! runtime of that thread's own, so that a request is written and its answer read by the
//! thread that asked, with no hand-over to another thread and back.
//!
//! Why not one client for all threads: a blocking client runs the I/O of every connection on
//! its one runtime thread, so all the threads that send together get about one core's worth of
//! HTTP. An async client's connections, in turn, are tasks of the runtime that opened them: a
//! connection opened on another thread's runtime makes progress only while that thread polls
//! it, so a client is never shared between runtimes. One client per thread and endpoint
//! configuration keeps every connection with the thread that uses it, alive and reused between
//! its deliveries.
//!
//! A thread's runtime runs only while that thread sends, so a connection the receiver closes
//! while the thread is idle is let go when the thread next sends (or ends), not at once; each
//! client keeps at most one idle connection a receiver, as a thread has one request in flight.

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
    /// The TLS configuration every thread's client shares: the system's root certificates,
    /// loaded and parsed once instead of once a thread (hundreds of kilobytes each), and one
    /// cache of TLS sessions to resume. `None` where it could not be made here: each client
    /// then sets up its own, as the client does by default.
    tls: Option<rustls::ClientConfig>,
}

/// Why this thread could not set up what it sends with (its runtime or its client).
pub(crate) type Unsent = Box<dyn std::error::Error + Send + Sync>;

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
        let mut settings = ClientSettings {
            timeout,
            connect_timeout,
            guard,
            user_agent,
            tls: shared_tls().ok(),
        };
        if settings.tls.is_some() && settings.client().is_ok() {
            return Ok(Arc::new(settings));
        }
        // Whatever went wrong, the client's own set-up says it best.
        settings.tls = None;
        settings.client()?;
        Ok(Arc::new(settings))
    }

    /// The limit on one whole exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The limit on establishing a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether the address guard lets deliveries go to `ip`.
    pub fn permits(&self, ip: std::net::IpAddr) -> bool {
        self.guard.permits(ip)
    }

    fn client(&self) -> Result<Client, reqwest::Error> {
        let builder = match &self.tls {
            Some(tls) => Client::builder().tls_backend_preconfigured(tls.clone()),
            None => Client::builder(),
        };
        builder
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::clone(&self.guard))))
            .user_agent(self.user_agent)
            .pool_max_idle_per_host(1)
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
        let (runtime, client) = THIS_THREAD
            .try_with(|clients| clients.borrow_mut().get(self))
            .map_err(|_| Unsent::from("the thread is ending"))??;
        Ok(runtime.block_on(async move {
            notice_closed_connections().await;
            exchange(client).await
        }))
    }
}

/// The TLS configuration the client would make for itself: the process's default crypto
/// provider (or the client's, aws-lc-rs), the platform's certificate verifier, HTTP/1.1.
fn shared_tls() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let verifier = rustls_platform_verifier::Verifier::new(Arc::clone(&provider))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
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
                        .map_err(Unsent::from)?,
                );
                self.runtime = Some(Rc::clone(&runtime));
                runtime
            }
        };
        // The clients of endpoints no longer used go, and with them their connections.
        self.clients
            .retain(|(made_from, _)| made_from.strong_count() > 0);
        let wanted = Arc::as_ptr(settings);
        if let Some((_, client)) = self
            .clients
            .iter()
            .find(|(made_from, _)| std::ptr::eq(made_from.as_ptr(), wanted))
        {
            return Ok((runtime, client.clone()));
        }
        let client = settings
            .client()
            .map_err(|error| Unsent::from(error.without_url()))?;
        self.clients
            .push((Arc::downgrade(settings), client.clone()));
        Ok((runtime, client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Arc<ClientSettings> {
        let guard = Arc::new(AddressGuard::new(&[]));
        ClientSettings::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
            guard,
            "test",
        )
        .expect("the client builds")
    }

    #[test]
    fn every_threads_client_shares_one_tls_configuration() {
        // Were the shared configuration refused by the client, each thread would load and
        // parse the system's root certificates for itself.
        assert!(
            settings().tls.is_some(),
            "the shared TLS configuration was refused"
        );
    }

    #[test]
    fn a_thread_keeps_one_client_per_settings_and_forgets_those_of_dropped_endpoints() {
        let first = settings();
        let second = settings();
        let count = || THIS_THREAD.with(|clients| clients.borrow().clients.len());
        first.run(|_| async {}).unwrap();
        first.run(|_| async {}).unwrap();
        assert_eq!(count(), 1);
        drop(first);
        second.run(|_| async {}).unwrap();
        assert_eq!(
            count(),
            1,
            "the dropped settings' client went when another was made"
        );
    }
}
