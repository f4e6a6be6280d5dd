-- Webhook endpoints' health, shared by the workers that deliver to them and changed by operators
-- (`outbox endpoint enable|disable`, the admin pages). A worker records what it sees every few
-- seconds, adopts a disable recorded here (a 410 Gone another worker or an earlier run was
-- told), and enables its endpoint when `enables` grows.
CREATE TABLE outbox_endpoint (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    state VARCHAR(16) NOT NULL,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    next_probe_at DATETIME(6),
    disabled_reason TEXT,
    enables BIGINT NOT NULL DEFAULT 0,
    reported_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
