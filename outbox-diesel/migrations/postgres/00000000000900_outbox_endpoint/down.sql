DROP TABLE outbox_endpoint;
