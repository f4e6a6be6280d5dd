-- Idempotency keys given at enqueue (EnqueueOptions::idempotency_key): a second enqueue with a
-- key recorded here is a no-op. A key is kept while its message is pending or dead-lettered and
-- for a window after it settled; the worker stamps `settled_at` once the message has left both
-- tables and deletes keys past the window, in bounded batches (see outbox-diesel's `idempotency`
-- module).
CREATE TABLE outbox_idempotency (
    idempotency_key TEXT NOT NULL PRIMARY KEY,
    message_id TEXT NOT NULL,
    message_position INTEGER,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    settled_at TEXT
);

CREATE INDEX outbox_idempotency_settled ON outbox_idempotency (settled_at, message_position);
