ALTER TABLE outbox_failure DROP COLUMN subscription_id, DROP COLUMN owner;
ALTER TABLE outbox_message DROP INDEX outbox_message_subscription, DROP COLUMN subscription_id,
    DROP COLUMN owner;
DROP TABLE outbox_subscription;
