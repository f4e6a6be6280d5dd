DROP TABLE outbox_cancelled;
