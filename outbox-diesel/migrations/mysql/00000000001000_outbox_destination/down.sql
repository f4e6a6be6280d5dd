ALTER TABLE outbox_destination DROP COLUMN kind;
RENAME TABLE outbox_destination TO outbox_endpoint;
