-- Ids of webhooks received, so a receiver drops duplicate deliveries (see outbox_diesel::inbox).
CREATE TABLE outbox_inbox (
    webhook_id VARCHAR(255) NOT NULL PRIMARY KEY,
    received_at DATETIME(6) NOT NULL,
    INDEX outbox_inbox_received (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
