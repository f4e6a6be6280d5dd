ALTER TABLE outbox_failure DROP COLUMN headers;
ALTER TABLE outbox_message DROP COLUMN headers;
