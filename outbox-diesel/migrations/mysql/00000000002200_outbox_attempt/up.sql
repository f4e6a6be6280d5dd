-- The delivery log: every exchange with a destination (`delivery_log`), written in the
-- transaction of the attempt's outcome, pruned by age and count by the worker.
CREATE TABLE outbox_attempt (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id CHAR(36) CHARACTER SET ascii NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    destination VARCHAR(255) NOT NULL,
    subscription_id VARCHAR(64),
    attempt INTEGER NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    status INTEGER,
    answer TEXT,
    error TEXT,
    latency_micros BIGINT NOT NULL,
    started_at DATETIME(6) NOT NULL,
    INDEX outbox_attempt_message_id (message_id),
    INDEX outbox_attempt_destination (destination, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
