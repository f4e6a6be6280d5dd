-- Messages an operator cancelled before they were delivered (`admin::cancel`): removed from the
-- outbox, never dead-lettered, kept here with the operator's reason.
CREATE TABLE outbox_cancelled (
    id BIGINT PRIMARY KEY,
    message_id UUID NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    payload JSONB NOT NULL,
    ordering_key VARCHAR(255),
    attempts INTEGER NOT NULL,
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0,
    group_name VARCHAR(255),
    owner VARCHAR(255),
    subscription_id VARCHAR(64),
    reason TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    cancelled_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX outbox_cancelled_message_id ON outbox_cancelled (message_id);
