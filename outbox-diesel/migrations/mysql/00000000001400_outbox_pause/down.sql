ALTER TABLE outbox_message DROP INDEX outbox_message_paused, DROP COLUMN paused;
DROP TABLE outbox_pause;
