-- Dead letters by age, so that the worker's retention (DieselStore::dead_letter_retention)
-- deletes the oldest in bounded batches without reading the whole table each time.
CREATE INDEX outbox_failure_failed_at ON outbox_failure (failed_at);
