DROP TABLE outbox_idempotency;
