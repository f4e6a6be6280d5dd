-- Headers set at enqueue (EnqueueOptions::header, trace context), as a JSON object of strings,
-- kept with a message through retries, dead-lettering and re-queueing. NULL: none, as for every
-- message enqueued before this migration.
ALTER TABLE outbox_message ADD COLUMN headers TEXT;
ALTER TABLE outbox_failure ADD COLUMN headers TEXT;
