ALTER TABLE outbox_message DROP COLUMN resumed_at;
