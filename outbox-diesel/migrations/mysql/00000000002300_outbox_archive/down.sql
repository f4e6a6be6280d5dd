DROP TABLE outbox_archive;
