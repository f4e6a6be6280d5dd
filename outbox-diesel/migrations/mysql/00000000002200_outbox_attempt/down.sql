DROP TABLE outbox_attempt;
