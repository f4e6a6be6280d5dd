DROP TRIGGER outbox_message_notify ON outbox_message;
DROP FUNCTION outbox_message_notify();
DROP TABLE outbox_failure;
DROP TABLE outbox_message;
