//! One outbox row about to be inserted, as the inserts of every backend bind it. The enqueue
//! checks and builds it (`enqueue.rs`); the statements only read it.

use outbox_core::{MessageId, Priority};

use crate::sql::bind::Bind;
use crate::sql::codec::priority_level;

/// Bytes of payload one batched `INSERT` carries at most, well under MySQL's default
/// `max_allowed_packet` (16 MiB) and cheap for any backend to parse.
const MAX_BATCH_PAYLOAD_BYTES: usize = 8 << 20;

/// One row about to be inserted.
#[derive(Debug)]
pub(crate) struct NewMessage {
    pub(crate) id: MessageId,
    pub(crate) message_id: String,
    pub(crate) message_type: &'static str,
    pub(crate) payload: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) priority: Priority,
    pub(crate) group: Option<String>,
    pub(crate) owner: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) not_before_micros: Option<i64>,
    /// How long after the enqueue, on the database's clock, when `not_before_micros` is `None`.
    pub(crate) delay_micros: Option<i64>,
    /// The headers as a JSON object, `None` without any.
    pub(crate) headers: Option<String>,
    /// An earlier message of this insert has the same ordering key: this one is parked behind
    /// it from the start (see the `sql` module's documentation).
    pub(crate) behind_in_batch: bool,
}

impl NewMessage {
    pub(crate) fn id(&self) -> MessageId {
        self.id
    }

    pub(crate) fn message_id(&self) -> &str {
        &self.message_id
    }

    pub(crate) fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    pub(crate) fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }
}

impl NewMessage {
    /// How many binds one row of an insert takes.
    pub(crate) const BINDS: usize = 12;

    /// The binds of an insert: message id, type, payload, its size in bytes, ordering key,
    /// not-before in µs since the epoch (NULL: now plus the delay), delay in µs (NULL: none),
    /// headers as JSON, priority level, group, owner, whether an earlier row of the insert has
    /// its ordering key.
    pub(crate) fn binds(&self) -> [Bind<'_>; Self::BINDS] {
        [
            Bind::Text(self.message_id.as_str()),
            Bind::Text(self.message_type),
            Bind::Text(self.payload.as_str()),
            Bind::BigInt(i64::try_from(self.payload.len()).unwrap_or(i64::MAX)),
            Bind::NullableText(self.ordering_key.as_deref()),
            Bind::NullableBigInt(self.not_before_micros),
            Bind::NullableBigInt(self.delay_micros),
            Bind::NullableText(self.headers.as_deref()),
            Bind::BigInt(i64::from(priority_level(self.priority))),
            Bind::NullableText(self.group.as_deref()),
            Bind::NullableText(self.owner.as_deref()),
            Bind::Bool(self.behind_in_batch),
        ]
    }

    /// [`binds`](Self::binds) and the ordering key again: for the inserts that look up whether
    /// the key has a pending message already.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn binds_with_key(&self) -> [Bind<'_>; Self::BINDS + 1] {
        let [a, b, c, d, e, f, g, h, i, j, k, l] = self.binds();
        [
            a,
            b,
            c,
            d,
            e,
            f,
            g,
            h,
            i,
            j,
            k,
            l,
            Bind::NullableText(self.ordering_key.as_deref()),
        ]
    }

    /// `rows` in chunks of at most `max_rows` rows and about 8 MiB of payload: one `INSERT`
    /// each.
    pub(crate) fn chunks(rows: &[NewMessage], max_rows: usize) -> Vec<&[NewMessage]> {
        let mut chunks = Vec::new();
        let mut rest = rows;
        while !rest.is_empty() {
            let mut take = 0;
            let mut bytes = 0;
            while take < rest.len() && take < max_rows.max(1) {
                bytes += rest[take].payload.len();
                if take > 0 && bytes > MAX_BATCH_PAYLOAD_BYTES {
                    break;
                }
                take += 1;
            }
            let (chunk, tail) = rest.split_at(take);
            chunks.push(chunk);
            rest = tail;
        }
        chunks
    }
}
