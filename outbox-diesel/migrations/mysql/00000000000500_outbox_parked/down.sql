ALTER TABLE outbox_message
    DROP INDEX outbox_message_parked,
    DROP INDEX outbox_message_due,
    DROP COLUMN parked,
    ADD INDEX outbox_message_due (next_attempt_at, id);
