-- Times are UTC text 'YYYY-MM-DD HH:MM:SS.SSS', which sorts in time order.
-- AUTOINCREMENT: without it SQLite reuses the ids of deleted rows, and a dead letter keeps the
-- id (position) its message had, so a new message must never get that id again.
CREATE TABLE outbox_message (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    message_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    ordering_key TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    next_attempt_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    locked_by TEXT,
    last_error TEXT
);

CREATE INDEX outbox_message_due ON outbox_message (next_attempt_at, id);
CREATE INDEX outbox_message_ordering ON outbox_message (ordering_key, id) WHERE ordering_key IS NOT NULL;

CREATE TABLE outbox_failure (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    message_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    ordering_key TEXT,
    attempts INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    created_at TEXT NOT NULL,
    failed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);

CREATE INDEX outbox_failure_type ON outbox_failure (message_type, id);
CREATE INDEX outbox_failure_message_id ON outbox_failure (message_id);
