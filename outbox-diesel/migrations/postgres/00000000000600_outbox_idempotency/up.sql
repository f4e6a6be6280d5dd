-- Idempotency keys given at enqueue (EnqueueOptions::idempotency_key): a second enqueue with a
-- key recorded here is a no-op. A key is kept while its message is pending or dead-lettered and
-- for a window after it settled; the worker stamps `settled_at` once the message has left both
-- tables and deletes keys past the window, in bounded batches (see outbox-diesel's `idempotency`
-- module).
CREATE TABLE outbox_idempotency (
    idempotency_key VARCHAR(255) PRIMARY KEY,
    message_id UUID NOT NULL,
    message_position BIGINT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    settled_at TIMESTAMPTZ
);

CREATE INDEX outbox_idempotency_settled ON outbox_idempotency (settled_at, message_position);
