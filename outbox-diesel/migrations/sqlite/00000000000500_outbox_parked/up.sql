-- Messages waiting behind the head of their ordering key are parked: outside the due index, so
-- a claim reads only what it may take, whatever the keyed backlog. The second index holds the
-- parked rows only, for the safety net that promotes keys left without a claimable head. See
-- the module documentation of outbox-diesel's `sql` for who parks and promotes them.
ALTER TABLE outbox_message ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
DROP INDEX outbox_message_due;
CREATE INDEX outbox_message_due ON outbox_message (next_attempt_at, id) WHERE parked = 0;
CREATE INDEX outbox_message_parked ON outbox_message (ordering_key, id) WHERE parked = 1;
