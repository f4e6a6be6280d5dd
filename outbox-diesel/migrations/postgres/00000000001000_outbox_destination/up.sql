-- Webhook endpoints became destinations of any kind (webhooks, brokers): the health table keeps
-- each one's kind beside its name.
ALTER TABLE outbox_endpoint RENAME TO outbox_destination;
ALTER TABLE outbox_destination ADD COLUMN kind VARCHAR(32) NOT NULL DEFAULT 'webhook';
