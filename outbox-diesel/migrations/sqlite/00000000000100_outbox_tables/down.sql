DROP TABLE outbox_failure;
DROP TABLE outbox_message;
