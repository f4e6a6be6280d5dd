-- The archive: messages and events that left the outbox delivered, kept for a window so an
-- operator can replay a range of them, or resend one, to one destination or subscription
-- (`delivery_log::replay`). Written only when the store keeps an archive.
CREATE TABLE outbox_archive (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    message_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    payload_bytes INTEGER,
    headers TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    created_at TEXT NOT NULL,
    archived_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX outbox_archive_created ON outbox_archive (created_at, id);
CREATE INDEX outbox_archive_message_id ON outbox_archive (message_id);
