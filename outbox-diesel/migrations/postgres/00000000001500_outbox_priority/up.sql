-- How soon a due message is claimed against the others (`EnqueueOptions::priority`): 0 for
-- most, higher first. The raised ones have an index of their own (unparked ones, as the due
-- index), which claims read before the due index: a backlog of ordinary messages however long
-- never stands in front of them, and ordinary messages (most) add nothing to it.
ALTER TABLE outbox_message ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX outbox_message_prioritized ON outbox_message (priority DESC, next_attempt_at, id)
    WHERE priority > 0 AND NOT parked;
-- A dead letter keeps its priority for a re-queue.
ALTER TABLE outbox_failure ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0;
