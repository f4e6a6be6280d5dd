-- The archive: messages and events that left the outbox delivered, kept for a window so an
-- operator can replay a range of them, or resend one, to one destination or subscription
-- (`delivery_log::replay`). Written only when the store keeps an archive.
CREATE TABLE outbox_archive (
    id BIGINT NOT NULL PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL,
    payload_bytes INTEGER,
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0,
    owner VARCHAR(255),
    created_at DATETIME(6) NOT NULL,
    archived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    INDEX outbox_archive_created (created_at, id),
    INDEX outbox_archive_message_id (message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
