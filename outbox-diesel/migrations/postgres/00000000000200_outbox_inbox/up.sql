-- Ids of webhooks received, so a receiver drops duplicate deliveries (see outbox_diesel::inbox).
CREATE TABLE outbox_inbox (
    webhook_id VARCHAR(255) PRIMARY KEY,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX outbox_inbox_received ON outbox_inbox (received_at);
