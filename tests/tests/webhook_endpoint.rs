//! `WebhookEndpoint` against a real HTTP receiver on 127.0.0.1: what it sends, and how it
//! classifies every kind of answer (and of no answer), for the message and for the endpoint's
//! health.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use outbox_diesel::destination::{DeliveryError, Destination, Envelope, Scope};
use outbox_diesel::webhook::{
    verify, WebhookEndpoint, WebhookEndpointBuilder, WebhookError, WebhookHeaders as _,
    WebhookSecret, DEFAULT_TOLERANCE,
};
use outbox_diesel::{FailureKind, Headers, MessageId};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::secret;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const PATIENCE: Duration = Duration::from_secs(5);

/// A complete answer, as raw bytes, after which the receiver closes the connection.
fn raw(status_line: &str, headers: &[(&str, &str)], body: &str) -> Reply {
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

/// A receiver that plays `replies` in order (and resets any request after them).
fn serve(replies: Vec<Reply>) -> Receiver {
    Receiver::start(move |_, n| replies.get(n).cloned().unwrap_or(Reply::Reset))
}

/// The `n`-th request (from 1) the receiver got, once it has.
fn nth(receiver: &Receiver, n: usize) -> Request {
    assert!(receiver.wait_for(n, PATIENCE), "request {n} never came");
    receiver.requests().swap_remove(n - 1)
}

fn envelope(data: serde_json::Value) -> Envelope {
    Envelope::new(
        MessageId::new(),
        "order.shipped",
        serde_json::to_vec(&data).unwrap(),
    )
}

fn to(receiver: &Receiver) -> WebhookEndpointBuilder {
    WebhookEndpoint::builder(receiver.url("/hook"))
        .secret(secret())
        .allow_address(LOCALHOST)
}

fn deliver_to(endpoint: &WebhookEndpoint) -> Result<(), DeliveryError> {
    endpoint.deliver(&envelope(serde_json::json!({"order_id": 7})))
}

/// Whether a connection is waiting on `listener` (nothing ever accepts from it).
fn was_dialled(listener: &TcpListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Ok(_) => true,
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(error) => panic!("{error}"),
    }
}

#[test]
fn delivers_a_signed_envelope_the_receiver_can_verify() {
    let receiver = serve(vec![
        raw("200 OK", &[], "thanks"),
        raw("204 No Content", &[], ""),
    ]);
    let rotated = WebhookSecret::from_bytes(*b"the key being rotated out").unwrap();
    let endpoint = to(&receiver)
        .secret(rotated.clone())
        .header("X-Tenant", "acme")
        .build()
        .unwrap();
    let envelope = envelope(serde_json::json!({"order_id": 7}));
    endpoint.deliver(&envelope).unwrap();
    let seen = nth(&receiver, 1);
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/hook")
    );
    let verified = verify(&[secret()], &seen.headers, &seen.body, DEFAULT_TOLERANCE).unwrap();
    assert_eq!(verified.id, envelope.message_id.to_string());
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
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("x-tenant"), Some("acme"));
    assert_eq!(
        seen.json(),
        serde_json::json!({
            "id": envelope.message_id.to_string(),
            "type": "order.shipped",
            "data": {"order_id": 7},
        })
    );

    // A body that is not JSON goes as it is, with its own content type.
    let text = envelope
        .clone()
        .with_body(b"made by hand".to_vec(), "text/plain");
    endpoint.deliver(&text).unwrap();
    let seen = nth(&receiver, 2);
    assert_eq!(seen.body, b"made by hand");
    assert_eq!(seen.header("content-type"), Some("text/plain"));
    let again = verify(&[secret()], &seen.headers, &seen.body, DEFAULT_TOLERANCE).unwrap();
    assert_eq!(
        again.id, verified.id,
        "the webhook-id is the message's stable id"
    );
}

#[test]
fn a_messages_headers_are_sent_unchanged_under_the_endpoints_own() {
    let receiver = serve(vec![raw("204 No Content", &[], "")]);
    let endpoint = to(&receiver)
        .header("x-api-key", "endpoint-key")
        .build()
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut headers = Headers::new();
    headers.insert("TraceParent", traceparent).unwrap();
    headers
        .insert("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        .unwrap();
    headers
        .insert("x-tenant", "acme \"quoted\"\tand tabbed")
        .unwrap();
    headers.insert("x-api-key", "forged-by-a-message").unwrap();
    let mut envelope = envelope(serde_json::json!({}));
    envelope.headers = headers;
    endpoint.deliver(&envelope).unwrap();

    let request = nth(&receiver, 1);
    assert_eq!(request.header("traceparent"), Some(traceparent));
    assert_eq!(
        request.header("tracestate"),
        Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    );
    assert_eq!(
        request.header("x-tenant"),
        Some("acme \"quoted\"\tand tabbed")
    );
    let api_keys: Vec<&str> = request
        .headers
        .iter()
        .filter(|(name, _)| name == "x-api-key")
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(api_keys, ["endpoint-key"], "the endpoint's header wins");
    let ids = request
        .headers
        .iter()
        .filter(|(name, _)| name == "webhook-id")
        .count();
    assert_eq!(ids, 1);
    verify(
        &[secret()],
        &request.headers,
        &request.body,
        DEFAULT_TOLERANCE,
    )
    .unwrap();
}

#[test]
fn server_errors_are_retryable_failures_of_the_endpoint_with_status_and_excerpt() {
    let receiver = serve(vec![raw(
        "500 Internal Server Error",
        &[],
        "database\nis down",
    )]);
    let endpoint = to(&receiver).build().unwrap();
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Retryable);
    assert_eq!(err.scope(), Scope::Destination, "counts towards a pause");
    assert_eq!(
        err.reason(),
        format!(
            "webhook http://{}/… answered 500 Internal Server Error: database is down",
            receiver.addr()
        )
    );
    assert_eq!(err.delay(), None);
}

#[test]
fn push_back_holds_the_endpoint_for_its_retry_after_clamped() {
    let receiver = serve(vec![
        raw("429 Too Many Requests", &[("Retry-After", "2")], ""),
        raw("503 Service Unavailable", &[("Retry-After", "999999")], ""),
        raw("502 Bad Gateway", &[("Retry-After", "7")], ""),
    ]);
    let endpoint = to(&receiver)
        .max_retry_after(Duration::from_secs(60))
        .build()
        .unwrap();
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(
        (err.kind(), err.scope()),
        (FailureKind::Deferred, Scope::Destination),
        "429 is push-back, not a failure"
    );
    assert_eq!(err.delay(), Some(Duration::from_secs(2)));
    assert!(err.reason().contains("429 Too Many Requests"), "{err}");
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Deferred);
    assert_eq!(err.delay(), Some(Duration::from_secs(60)));
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(
        (err.kind(), err.delay()),
        (FailureKind::Retryable, Some(Duration::from_secs(7))),
        "a 502 with Retry-After is a failure that waits"
    );
}

#[test]
fn client_errors_are_permanent() {
    let receiver = serve(vec![
        raw("400 Bad Request", &[("Retry-After", "5")], ""),
        raw("410 Gone", &[], "no such hook"),
    ]);
    let endpoint = to(&receiver).build().unwrap();
    let bad = deliver_to(&endpoint).unwrap_err();
    assert_eq!(bad.kind(), FailureKind::Permanent);
    assert!(bad.reason().contains("400 Bad Request"), "{bad}");
    assert_eq!(bad.delay(), None);
    assert_eq!(bad.scope(), Scope::Message, "a 400 is about the message");
    let gone = deliver_to(&endpoint).unwrap_err();
    assert_eq!(
        (gone.kind(), gone.scope()),
        (FailureKind::Permanent, Scope::Destination),
        "a 410 is about the endpoint: it disables it"
    );
    assert!(gone.reason().ends_with("410 Gone: no such hook"), "{gone}");
}

#[test]
fn redirects_are_permanent_and_not_followed() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere = format!("http://{}/moved", listener.local_addr().unwrap());
    let receiver = serve(vec![
        raw("308 Permanent Redirect", &[("Location", &elsewhere)], ""),
        raw("200 OK", &[], ""),
    ]);
    let endpoint = to(&receiver).build().unwrap();
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent);
    assert!(err.reason().contains("308 Permanent Redirect"), "{err}");
    assert!(err.reason().contains("redirects are not followed"), "{err}");
    assert!(err.reason().contains(&elsewhere), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(receiver.count(), 1, "the receiver saw a second request");
    assert!(!was_dialled(&listener), "the redirect target was dialled");
}

#[test]
fn a_silent_receiver_times_out_as_retryable() {
    let receiver = serve(vec![Reply::Hang(Duration::from_secs(3))]);
    let endpoint = to(&receiver)
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
    assert_eq!(refused.scope(), Scope::Destination);
    assert!(
        refused.reason().starts_with("could not connect to webhook"),
        "{refused}"
    );

    let receiver = serve(vec![Reply::Reset]);
    let endpoint = to(&receiver).build().unwrap();
    let hung_up = deliver_to(&endpoint).unwrap_err();
    assert_eq!(hung_up.kind(), FailureKind::Retryable);
    assert!(
        hung_up.reason().contains(&receiver.addr().to_string()),
        "{hung_up}"
    );
    assert!(
        !hung_up.reason().contains("/hook"),
        "the path may hold a token: {hung_up}"
    );
}

#[test]
fn a_huge_answer_is_read_only_up_to_the_cap() {
    let receiver = serve(vec![Reply::Huge {
        status: 500,
        len: 10 * 1024 * 1024,
    }]);
    let endpoint = to(&receiver).build().unwrap();
    let response = endpoint.post("msg_1", b"{}").unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(response.body().len(), 64 * 1024);
    let err = response.error_for_status().unwrap_err();
    let WebhookError::Status { excerpt, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(excerpt.chars().count(), 201);
    assert!(excerpt.ends_with('…'));
    assert!(err.into_delivery_error().reason().len() < 400);
}

#[test]
fn an_allowed_address_is_reachable_by_name_too() {
    let receiver = serve(vec![raw("200 OK", &[], "")]);
    let url = format!("http://localhost:{}/hook", receiver.addr().port());
    let endpoint = WebhookEndpoint::builder(url)
        .secret(secret())
        .allow_address(LOCALHOST)
        .build()
        .unwrap();
    deliver_to(&endpoint).unwrap();
    assert_eq!(nth(&receiver, 1).path, "/hook");
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
        assert_eq!(err.scope(), Scope::Unsent, "{url}: {err}");
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
fn an_endpoint_is_built_in_async_code_and_sends_from_its_blocking_pool() {
    // As in a Rocket handler: built and dropped on a runtime's thread, sending from
    // `spawn_blocking` (each sending thread runs a runtime of its own).
    let receiver = Receiver::ok();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let url = receiver.url("/hook");
    runtime.block_on(async move {
        let endpoint = WebhookEndpoint::builder(url)
            .secret(secret())
            .allow_address(LOCALHOST)
            .build()
            .unwrap();
        let sender = endpoint.clone();
        let sent = tokio::task::spawn_blocking(move || deliver_to(&sender))
            .await
            .expect("the blocking task ran to its end");
        assert!(sent.is_ok(), "{sent:?}");
        drop(endpoint);
    });
    assert!(receiver.wait_for(1, PATIENCE));
}

#[test]
fn an_https_delivery_refuses_a_certificate_no_root_vouches_for() {
    // A receiver with a self-signed certificate: the handshake happens, the certificate is
    // checked against the system's roots, and refused.
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    // The receiver would take HTTP/2 first: the client offers HTTP/1.1 only.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let listener = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::Read as _;
        let (stream, _) = listener.accept().unwrap();
        let connection = rustls::ServerConnection::new(std::sync::Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, stream);
        let mut byte = [0; 1];
        // The client gives up during the handshake: the read fails or ends.
        let _ = tls.read(&mut byte);
        tls.conn.alpn_protocol().map(<[u8]>::to_vec)
    });
    let endpoint = WebhookEndpoint::builder(format!("https://127.0.0.1:{port}/hook"))
        .secret(secret())
        .allow_address(LOCALHOST)
        .build()
        .unwrap();
    let err = deliver_to(&endpoint).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Retryable, "{err}");
    assert!(err.reason().contains("certificate"), "{err}");
    assert_eq!(
        server.join().unwrap().as_deref(),
        Some(&b"http/1.1"[..]),
        "the handshake agreed on HTTP/1.1"
    );
}

#[test]
fn each_sending_thread_keeps_its_connection_and_ends_cleanly() {
    let receiver = Receiver::ok();
    let endpoint = to(&receiver).build().unwrap();
    for _ in 0..20 {
        deliver_to(&endpoint).unwrap();
    }
    assert_eq!(
        receiver.connections(),
        1,
        "one thread reuses one connection"
    );
    // Threads that send, then end: their clients and runtimes go with them, without a panic.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let endpoint = endpoint.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    deliver_to(&endpoint).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a sending thread ended cleanly");
    }
    assert!(receiver.wait_for(40, PATIENCE));
    assert_eq!(
        receiver.connections(),
        5,
        "each of the 4 threads opened one connection of its own"
    );
    // An endpoint made with `to_url` shares this thread's client, and so its connection.
    let sibling = endpoint
        .to_url(&receiver.url("/other"), vec![secret()])
        .unwrap();
    deliver_to(&sibling).unwrap();
    assert_eq!(receiver.connections(), 5, "to_url shares the connection");
}

#[test]
fn a_receiver_that_closed_its_idle_connections_gets_the_next_delivery_at_once() {
    // A restarted receiver (or one whose idle timeout is shorter than the client's) closes
    // the connection the client keeps for its next delivery. That is no failure of the
    // receiver: the next delivery goes through on a new connection, at its first try.
    let receiver = Receiver::ok();
    let endpoint = to(&receiver).build().unwrap();
    for round in 0..20 {
        deliver_to(&endpoint).unwrap_or_else(|error| panic!("round {round}: {error}"));
        receiver.restart();
    }
    deliver_to(&endpoint).unwrap();
    assert_eq!(
        receiver.connections(),
        21,
        "a new connection after each restart"
    );
}

#[test]
fn a_trickled_answer_is_cut_at_the_endpoint_timeout_and_retried() {
    // One byte every 100 ms never stalls a single read for long, yet the whole answer would
    // take 100 s.
    let receiver = serve(vec![Reply::TrickleBody {
        every: Duration::from_millis(100),
        bytes: 1000,
    }]);
    let endpoint = to(&receiver)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = deliver_to(&endpoint).unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.kind(), FailureKind::Retryable, "{err}");
    assert!(err.reason().contains("within 1s"), "{err}");
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
}
