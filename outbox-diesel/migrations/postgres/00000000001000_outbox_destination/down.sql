ALTER TABLE outbox_destination DROP COLUMN kind;
ALTER TABLE outbox_destination RENAME TO outbox_endpoint;
