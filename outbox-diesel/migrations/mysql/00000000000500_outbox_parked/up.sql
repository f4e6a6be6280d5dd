-- Messages waiting behind the head of their ordering key are parked: in the due index after
-- every unparked one, so a claim reads only what it may take, whatever the keyed backlog. The
-- second index serves the safety net that promotes keys left without a claimable head (a loose
-- scan of its parked part). See the module documentation of outbox-diesel's `sql`.
ALTER TABLE outbox_message
    ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE,
    DROP INDEX outbox_message_due,
    ADD INDEX outbox_message_due (parked, next_attempt_at, id),
    ADD INDEX outbox_message_parked (parked, ordering_key, id);
