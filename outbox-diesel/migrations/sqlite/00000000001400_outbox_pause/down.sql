DROP INDEX outbox_message_paused;
ALTER TABLE outbox_message DROP COLUMN paused;
DROP TABLE outbox_pause;
