-- Webhook endpoints became destinations of any kind (webhooks, brokers): the health table keeps
-- each one's kind beside its name.
RENAME TABLE outbox_endpoint TO outbox_destination;
ALTER TABLE outbox_destination ADD COLUMN kind VARCHAR(32) NOT NULL DEFAULT 'webhook' AFTER name;
