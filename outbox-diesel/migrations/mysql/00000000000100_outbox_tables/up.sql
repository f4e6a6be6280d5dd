-- Times are UTC, written by the library with UTC_TIMESTAMP(6), whatever the session time zone.
CREATE TABLE outbox_message (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL,
    ordering_key VARCHAR(255),
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at DATETIME(6) NOT NULL,
    next_attempt_at DATETIME(6) NOT NULL,
    locked_by CHAR(36) CHARACTER SET ascii,
    last_error TEXT,
    INDEX outbox_message_due (next_attempt_at, id),
    INDEX outbox_message_ordering (ordering_key, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_failure (
    id BIGINT NOT NULL PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL,
    ordering_key VARCHAR(255),
    attempts INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    failed_at DATETIME(6) NOT NULL,
    INDEX outbox_failure_type (message_type, id),
    INDEX outbox_failure_message_id (message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
