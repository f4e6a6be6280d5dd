ALTER TABLE outbox_failure DROP COLUMN subscription_id;
ALTER TABLE outbox_failure DROP COLUMN owner;
DROP INDEX outbox_message_subscription;
ALTER TABLE outbox_message DROP COLUMN subscription_id;
ALTER TABLE outbox_message DROP COLUMN owner;
DROP TABLE outbox_subscription;
