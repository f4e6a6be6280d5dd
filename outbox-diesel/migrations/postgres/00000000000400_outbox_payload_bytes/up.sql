-- The payload's size in bytes, written at enqueue, so that a claim keeps within the worker's
-- byte cap without rendering every candidate's JSON. NULL for rows enqueued before.
ALTER TABLE outbox_message ADD COLUMN payload_bytes INTEGER;
