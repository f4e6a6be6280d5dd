DROP INDEX outbox_failure_failed_at;
