-- Messages an operator cancelled before they were delivered (`admin::cancel`): removed from the
-- outbox, never dead-lettered, kept here with the operator's reason.
CREATE TABLE outbox_cancelled (
    id BIGINT NOT NULL PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL,
    ordering_key VARCHAR(255),
    attempts INTEGER NOT NULL,
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0,
    group_name VARCHAR(255),
    owner VARCHAR(255),
    subscription_id VARCHAR(64),
    reason TEXT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    cancelled_at DATETIME(6) NOT NULL,
    INDEX outbox_cancelled_message_id (message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
