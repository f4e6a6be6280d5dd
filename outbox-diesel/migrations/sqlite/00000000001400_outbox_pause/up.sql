-- Message types and destinations an operator paused (`outbox pause`, the admin pages): every
-- worker reads them every few seconds and keeps their messages pending until resumed.
CREATE TABLE outbox_pause (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    paused_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (kind, name)
);
-- A message a worker found paused is due far in the future (out of every claim's way) and
-- marked, so that a resume finds exactly those again.
ALTER TABLE outbox_message ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
CREATE INDEX outbox_message_paused ON outbox_message (message_type) WHERE paused = 1;
