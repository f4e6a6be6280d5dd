-- Subscriptions: endpoints an application's customers add and remove while the workers run
-- (`outbox_diesel::subscription`). A message type routed to them is an event, which the worker
-- that claims it fans out into one delivery (a message of its own) per matching subscription.
CREATE TABLE outbox_subscription (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    owner VARCHAR(255),
    url TEXT NOT NULL,
    -- The event-type filters, a JSON array of strings.
    event_types TEXT NOT NULL,
    -- The signing secret (`whsec_...`), encrypted when the application gives a key.
    secret TEXT NOT NULL,
    -- The secret a rotation replaced, signed with too until its overlap ends.
    previous_secret TEXT,
    previous_secret_until DATETIME(6),
    rate_limit INTEGER,
    allow_http BOOLEAN NOT NULL DEFAULT FALSE,
    description TEXT,
    -- A JSON object the application keeps with it.
    metadata TEXT,
    enabled BOOLEAN NOT NULL DEFAULT TRUE,
    created_at DATETIME(6) NOT NULL,
    updated_at DATETIME(6) NOT NULL,
    -- A fan-out reads the enabled subscriptions of one owner.
    INDEX outbox_subscription_owner (owner, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- An event's owner (tenant): it reaches only that owner's subscriptions; the subscription a
-- message is a delivery for.
ALTER TABLE outbox_message
    ADD COLUMN owner VARCHAR(255),
    ADD COLUMN subscription_id VARCHAR(64),
    ADD INDEX outbox_message_subscription (subscription_id);
ALTER TABLE outbox_failure
    ADD COLUMN owner VARCHAR(255),
    ADD COLUMN subscription_id VARCHAR(64);
