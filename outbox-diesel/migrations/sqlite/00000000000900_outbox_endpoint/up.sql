-- Webhook endpoints' health, shared by the workers that deliver to them and changed by operators
-- (`outbox endpoint enable|disable`, the admin pages). A worker records what it sees every few
-- seconds, adopts a disable recorded here (a 410 Gone another worker or an earlier run was
-- told), and enables its endpoint when `enables` grows.
CREATE TABLE outbox_endpoint (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    next_probe_at TEXT,
    disabled_reason TEXT,
    enables INTEGER NOT NULL DEFAULT 0,
    reported_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
