ALTER TABLE outbox_failure DROP COLUMN priority;
ALTER TABLE outbox_message DROP INDEX outbox_message_prioritized, DROP COLUMN priority;
