ALTER TABLE outbox_failure DROP COLUMN priority;
DROP INDEX outbox_message_prioritized;
ALTER TABLE outbox_message DROP COLUMN priority;
