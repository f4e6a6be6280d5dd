-- The delivery log: every exchange with a destination (`delivery_log`), written in the
-- transaction of the attempt's outcome, pruned by age and count by the worker. AUTOINCREMENT:
-- a log pruned empty must not hand out its ids again (pages are read by id).
CREATE TABLE outbox_attempt (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    message_type TEXT NOT NULL,
    destination TEXT NOT NULL,
    subscription_id TEXT,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    answer TEXT,
    error TEXT,
    latency_micros INTEGER NOT NULL,
    started_at TEXT NOT NULL
);
CREATE INDEX outbox_attempt_message_id ON outbox_attempt (message_id);
CREATE INDEX outbox_attempt_destination ON outbox_attempt (destination, id);
