ALTER TABLE outbox_message DROP COLUMN payload_bytes;
