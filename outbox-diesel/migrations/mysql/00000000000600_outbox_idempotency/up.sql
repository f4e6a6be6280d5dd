-- Idempotency keys given at enqueue (EnqueueOptions::idempotency_key): a second enqueue with a
-- key recorded here is a no-op. A key is kept while its message is pending or dead-lettered and
-- for a window after it settled; the worker stamps `settled_at` once the message has left both
-- tables and deletes keys past the window, in bounded batches (see outbox-diesel's `idempotency`
-- module). The key is VARBINARY so that keys compare byte by byte, as on the other backends
-- (MariaDB's utf8mb4_bin ignores trailing spaces).
CREATE TABLE outbox_idempotency (
    idempotency_key VARBINARY(255) NOT NULL PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_position BIGINT,
    created_at DATETIME(6) NOT NULL,
    settled_at DATETIME(6),
    INDEX outbox_idempotency_settled (settled_at, message_position)
) ENGINE = InnoDB;
