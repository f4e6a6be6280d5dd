DROP INDEX outbox_message_parked;
DROP INDEX outbox_message_due;
ALTER TABLE outbox_message DROP COLUMN parked;
CREATE INDEX outbox_message_due ON outbox_message (next_attempt_at, id);
