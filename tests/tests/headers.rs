//! Headers a message carries from its enqueue to its delivery, on every backend: a
//! `traceparent` given at enqueue (or taken from the current OpenTelemetry span) reaches the
//! receiver unchanged, headers survive dead-lettering and re-queueing, what HTTP cannot carry
//! is refused at enqueue without writing anything, a row whose headers were edited into
//! nonsense is dead-lettered alone, and a database upgraded with messages in it delivers them.

use std::sync::Mutex;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::Connection;
use diesel_migrations::MigrationHarness;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use outbox_diesel::admin::{dead_letters, requeue_dead_letters, DeadLetterSelection, ListOptions};
use outbox_diesel::prelude::*;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Settlement, Store};
use outbox_diesel::{
    outbox_handler, run_migrations, Batch, Context, DieselStore, EnqueueOptions, Error,
    HeaderError, Message, ProcessError, Worker,
};
use outbox_testkit::db::migrate_to_before;
use outbox_testkit::http::Receiver;
use outbox_testkit::outbox::{dead, endpoint, insert_before_headers, outcome, pending};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb};
use outbox_tests::handlers::{Hook, HOOK};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(60);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// Records the trace its handler runs in: (message n, trace id, parent span id, remote).
#[outbox_handler("headers.traced")]
#[derive(Debug, Serialize, Deserialize)]
struct Traced {
    n: u32,
}

static TRACES: Mutex<Vec<(u32, String, String, bool)>> = Mutex::new(Vec::new());

impl Handler for Traced {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let current = opentelemetry::Context::current();
        let span = current.span().span_context().clone();
        TRACES.lock().unwrap().push((
            self.n,
            span.trace_id().to_string(),
            span.span_id().to_string(),
            span.is_remote(),
        ));
        assert_eq!(ctx.headers().get("traceparent").is_some(), span.is_valid());
        Ok(())
    }
}

fn a_traceparent_given_at_enqueue_arrives_at_the_receiver_unchanged<C: TestConnection>(
    db: &TestDb,
) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(5);
    let options = EnqueueOptions::new()
        .header("traceparent", TRACEPARENT)
        .header("TraceState", TRACESTATE)
        .header("X-Tenant", "acme");
    Hook::new(1)
        .enqueue_with(&mut pool.get().unwrap(), &options)
        .unwrap();
    Hook::new(2).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    assert!(receiver.wait_for(2, PATIENCE));
    worker.shutdown(PATIENCE).unwrap();

    let requests = receiver.requests();
    let with = requests
        .iter()
        .find(|r| r.json()["data"]["n"] == 1)
        .unwrap();
    assert_eq!(with.header("traceparent"), Some(TRACEPARENT));
    assert_eq!(with.header("tracestate"), Some(TRACESTATE));
    assert_eq!(with.header("x-tenant"), Some("acme"));
    let without = requests
        .iter()
        .find(|r| r.json()["data"]["n"] == 2)
        .unwrap();
    assert_eq!(without.header("traceparent"), None);
    assert_eq!(without.header("x-tenant"), None);
    assert!(pending(&pool).is_empty());
}

/// The current OpenTelemetry span at enqueue becomes the message's `traceparent` (the tests
/// crate enables the `opentelemetry` feature), and the handler runs with it as remote parent.
fn the_current_span_is_carried_to_the_handler_as_its_remote_parent<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let run = fastrand::u32(1_000..u32::MAX / 2);
    let span = SpanContext::new(
        TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
        SpanId::from_hex("b7ad6b7169203331").unwrap(),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    );
    {
        let _request = opentelemetry::Context::new()
            .with_remote_span_context(span)
            .attach();
        Traced { n: run }.enqueue(&mut pool.get().unwrap()).unwrap();
    }
    Traced { n: run + 1 }
        .enqueue(&mut pool.get().unwrap())
        .unwrap();
    let stored = pending(&pool);
    assert_eq!(
        stored[0].headers.get("traceparent"),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert!(stored[1].headers.is_empty(), "{:?}", stored[1].headers);

    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    let seen = |n: u32| TRACES.lock().unwrap().iter().find(|t| t.0 == n).cloned();
    assert!(eventually(PATIENCE, || seen(run).is_some() && seen(run + 1).is_some()));
    worker.shutdown(PATIENCE).unwrap();
    let (_, trace_id, parent, remote) = seen(run).unwrap();
    assert_eq!(
        (trace_id.as_str(), parent.as_str(), remote),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", true)
    );
    let (_, untraced, _, _) = seen(run + 1).unwrap();
    assert_eq!(untraced, "00000000000000000000000000000000");
}

fn headers_stay_with_their_message_through_batches_dead_letters_and_requeues<C>(db: &TestDb)
where
    C: TestConnection,
{
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    // One batch insert, headers on the middle row only: the binds of each row stay its own.
    let mut batch = Batch::new();
    batch.push(&Hook::new(1)).unwrap();
    batch
        .push_with(
            &Hook::new(2),
            &EnqueueOptions::new()
                .ordering_key("k")
                .header("traceparent", TRACEPARENT)
                .header("x-quoted", r#"a "b" \c"#),
        )
        .unwrap();
    batch.push(&Hook::new(3)).unwrap();
    batch.enqueue(&mut pool.get().unwrap()).unwrap();

    let token = ClaimToken::new();
    let claimed = store.claim(token, ClaimLimit::messages(10), LEASE).unwrap();
    assert_eq!(claimed.len(), 3);
    let headers: Vec<Vec<(&str, &str)>> =
        claimed.iter().map(|m| m.headers.iter().collect()).collect();
    assert_eq!(
        headers,
        [
            vec![],
            vec![("traceparent", TRACEPARENT), ("x-quoted", r#"a "b" \c"#)],
            vec![]
        ]
    );
    let outcomes: Vec<_> = claimed
        .iter()
        .map(|m| {
            let error = "kept for the headers test".to_owned();
            outcome(token, m, Settlement::DeadLetter { error })
        })
        .collect();
    store.settle(&outcomes).unwrap();
    let letters = dead(&pool);
    assert_eq!(letters[1].headers.get("traceparent"), Some(TRACEPARENT));
    assert!(letters[0].headers.is_empty() && letters[2].headers.is_empty());

    requeue_dead_letters(&mut pool.get().unwrap(), &DeadLetterSelection::All).unwrap();
    let again = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(again.len(), 3);
    assert_eq!(again[1].headers, claimed[1].headers);
    assert_eq!(
        pending(&pool)[1].headers.get("x-quoted"),
        Some(r#"a "b" \c"#)
    );
}

fn headers_http_cannot_carry_are_refused_and_nothing_is_written<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let mut conn = pool.get().unwrap();
    let refused = |options: EnqueueOptions, conn: &mut C| {
        conn.transaction(|tx| {
            let error = Hook::new(1).enqueue_with(tx, &options).unwrap_err();
            // The transaction is untouched: the application carries on in it.
            Hook::new(2).enqueue(tx)?;
            Ok::<_, Error>(error)
        })
        .unwrap()
    };
    let forged = refused(
        EnqueueOptions::new().header("Webhook-Id", "forged"),
        &mut conn,
    );
    assert!(
        matches!(forged, Error::Header(HeaderError::Reserved { .. })),
        "{forged}"
    );
    let split = refused(
        EnqueueOptions::new().header("x-note", "a\r\nx-injected: 1"),
        &mut conn,
    );
    assert!(
        matches!(split, Error::Header(HeaderError::InvalidValue { .. })),
        "{split}"
    );
    let huge = refused(
        EnqueueOptions::new().header("x-big", "v".repeat(outbox_diesel::MAX_HEADER_BYTES)),
        &mut conn,
    );
    assert!(
        matches!(huge, Error::Header(HeaderError::TooLarge)),
        "{huge}"
    );
    let written: Vec<u32> = pending(&pool)
        .iter()
        .map(|m| serde_json::from_str::<Hook>(&m.payload).unwrap().n)
        .collect();
    assert_eq!(
        written,
        [2, 2, 2],
        "only the messages enqueued after each refusal"
    );
}

fn a_row_whose_headers_were_edited_into_nonsense_is_dead_lettered_alone<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(3);
    let store = DieselStore::new(pool.clone());
    let mut conn = pool.get().unwrap();
    for n in 1..=3 {
        Hook::new(n)
            .enqueue_with(
                &mut conn,
                &EnqueueOptions::new().header("x-n", n.to_string()),
            )
            .unwrap();
    }
    let middle = pending(&pool)[1].position;
    conn.batch_execute(&format!(
        "UPDATE outbox_message SET headers = '{{\"bad name\": \"x\"}}' WHERE id = {middle}"
    ))
    .unwrap();
    let claimed = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    let delivered: Vec<Option<&str>> = claimed.iter().map(|m| m.headers.get("x-n")).collect();
    assert_eq!(delivered, [Some("1"), Some("3")]);
    let letters = dead_letters(&mut conn, &ListOptions::new()).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].position, middle);
    assert!(
        letters[0].last_error.contains("headers") && letters[0].last_error.contains("bad name"),
        "{}",
        letters[0].last_error
    );
    // Still listed, so an operator can see and purge it.
    assert!(letters[0].headers.is_empty());
}

fn messages_written_before_the_headers_column_are_delivered_after_the_upgrade<C>(db: &TestDb)
where
    C: TestConnection + MigrationHarness<<C as Connection>::Backend>,
{
    let receiver = Receiver::ok();
    let mut conn = db.connect::<C>();
    migrate_to_before(&mut conn, db.backend(), "800");
    // This library's enqueue on the older schema: a clear error, not a bare SQL one.
    let refused = Hook::new(99).enqueue(&mut conn).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::SchemaOutOfDate {
                column: "headers",
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("run_migrations"), "{refused}");
    for n in 0..20 {
        let payload = serde_json::to_string(&Hook::new(n)).unwrap();
        conn.batch_execute(&insert_before_headers(
            db.backend(),
            Hook::MESSAGE_TYPE,
            &payload,
            None,
        ))
        .unwrap();
    }
    let postgres_only = usize::from(db.backend() == Backend::Postgres);
    assert_eq!(
        run_migrations(&mut conn).unwrap().len(),
        14 + 2 * postgres_only,
        "the headers column, the endpoints' table, its renaming to destinations, parking what \
         waits behind its key, signed-out admin sessions, operators' pauses, priorities, groups, \
         shared turns, the end of a pause, subscriptions, cancelled messages, the delivery log, the archive (and on PostgreSQL the due time in \
         notifications and the lease in a column of its own)"
    );

    let pool = db.pool::<C>(5);
    Hook::new(20)
        .enqueue_with(
            &mut pool.get().unwrap(),
            &EnqueueOptions::new().header("traceparent", TRACEPARENT),
        )
        .unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    assert!(receiver.wait_unique(21, PATIENCE));
    worker.shutdown(PATIENCE).unwrap();
    let traced: Vec<u64> = receiver
        .requests()
        .iter()
        .filter(|r| r.header("traceparent") == Some(TRACEPARENT))
        .map(|r| r.json()["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(traced, [20]);
    assert!(pending(&pool).is_empty() && dead(&pool).is_empty());
}

backend_tests!(
    a_traceparent_given_at_enqueue_arrives_at_the_receiver_unchanged,
    the_current_span_is_carried_to_the_handler_as_its_remote_parent,
    headers_stay_with_their_message_through_batches_dead_letters_and_requeues,
    headers_http_cannot_carry_are_refused_and_nothing_is_written,
    a_row_whose_headers_were_edited_into_nonsense_is_dead_lettered_alone,
    messages_written_before_the_headers_column_are_delivered_after_the_upgrade,
);
