-- Message types and destinations an operator paused (`outbox pause`, the admin pages): every
-- worker reads them every few seconds and keeps their messages pending until resumed.
CREATE TABLE outbox_pause (
    kind VARCHAR(16) NOT NULL,
    name VARCHAR(255) NOT NULL,
    reason TEXT NOT NULL,
    paused_at DATETIME(6) NOT NULL,
    PRIMARY KEY (kind, name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- A message a worker found paused is due far in the future (out of every claim's way) and
-- marked, so that a resume finds exactly those again.
ALTER TABLE outbox_message
    ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE,
    ADD INDEX outbox_message_paused (paused, message_type);
