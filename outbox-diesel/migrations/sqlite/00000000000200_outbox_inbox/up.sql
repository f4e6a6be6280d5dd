-- Ids of webhooks received, so a receiver drops duplicate deliveries (see outbox_diesel::inbox).
CREATE TABLE outbox_inbox (
    webhook_id TEXT PRIMARY KEY,
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);

CREATE INDEX outbox_inbox_received ON outbox_inbox (received_at);
