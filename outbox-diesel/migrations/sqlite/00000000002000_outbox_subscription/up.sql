-- Subscriptions: endpoints an application's customers add and remove while the workers run
-- (`outbox_diesel::subscription`). A message type routed to them is an event, which the worker
-- that claims it fans out into one delivery (a message of its own) per matching subscription.
CREATE TABLE outbox_subscription (
    id TEXT NOT NULL PRIMARY KEY,
    owner TEXT,
    url TEXT NOT NULL,
    -- The event-type filters, a JSON array of strings.
    event_types TEXT NOT NULL,
    -- The signing secret (`whsec_...`), encrypted when the application gives a key.
    secret TEXT NOT NULL,
    -- The secret a rotation replaced, signed with too until its overlap ends.
    previous_secret TEXT,
    previous_secret_until TEXT,
    rate_limit INTEGER,
    allow_http INTEGER NOT NULL DEFAULT 0,
    description TEXT,
    -- A JSON object the application keeps with it.
    metadata TEXT,
    enabled INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
-- A fan-out reads the enabled subscriptions of one owner.
CREATE INDEX outbox_subscription_owner ON outbox_subscription (owner, created_at);
-- An event's owner (tenant): it reaches only that owner's subscriptions.
ALTER TABLE outbox_message ADD COLUMN owner TEXT;
-- The subscription a message is a delivery for.
ALTER TABLE outbox_message ADD COLUMN subscription_id TEXT;
CREATE INDEX outbox_message_subscription ON outbox_message (subscription_id)
    WHERE subscription_id IS NOT NULL;
ALTER TABLE outbox_failure ADD COLUMN owner TEXT;
ALTER TABLE outbox_failure ADD COLUMN subscription_id TEXT;
