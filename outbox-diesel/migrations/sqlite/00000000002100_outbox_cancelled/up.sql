-- Messages an operator cancelled before they were delivered (`admin::cancel`): removed from the
-- outbox, never dead-lettered, kept here with the operator's reason.
CREATE TABLE outbox_cancelled (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    message_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    ordering_key TEXT,
    attempts INTEGER NOT NULL,
    headers TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    group_name TEXT,
    owner TEXT,
    subscription_id TEXT,
    reason TEXT NOT NULL,
    created_at TEXT NOT NULL,
    cancelled_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX outbox_cancelled_message_id ON outbox_cancelled (message_id);
