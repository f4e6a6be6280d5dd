-- The archive: messages and events that left the outbox delivered, kept for a window so an
-- operator can replay a range of them, or resend one, to one destination or subscription
-- (`delivery_log::replay`). Written only when the store keeps an archive.
CREATE TABLE outbox_archive (
    id BIGINT PRIMARY KEY,
    message_id UUID NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSONB NOT NULL,
    payload_bytes INTEGER,
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0,
    owner VARCHAR(255),
    created_at TIMESTAMPTZ NOT NULL,
    archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX outbox_archive_created ON outbox_archive (created_at, id);
CREATE INDEX outbox_archive_message_id ON outbox_archive (message_id);
