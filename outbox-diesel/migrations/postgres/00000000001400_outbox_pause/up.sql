-- Message types and destinations an operator paused (`outbox pause`, the admin pages): every
-- worker reads them every few seconds and keeps their messages pending until resumed.
CREATE TABLE outbox_pause (
    kind VARCHAR(16) NOT NULL,
    name VARCHAR(255) NOT NULL,
    reason TEXT NOT NULL,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, name)
);
-- A message a worker found paused is due far in the future (out of every claim's way) and
-- marked, so that a resume finds exactly those again.
ALTER TABLE outbox_message ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX outbox_message_paused ON outbox_message (message_type) WHERE paused;
