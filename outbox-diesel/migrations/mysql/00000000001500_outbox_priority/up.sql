-- How soon a due message is claimed against the others (`EnqueueOptions::priority`): 0 for
-- most, higher first. Claims read the raised ones by this index before the due index, so a
-- backlog of ordinary messages however long never stands in front of them (MySQL has no
-- partial index: every message has an entry here, which a claim reads only where priority > 0).
ALTER TABLE outbox_message
    ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0,
    ADD INDEX outbox_message_prioritized (parked, priority, next_attempt_at, id);
-- A dead letter keeps its priority for a re-queue.
ALTER TABLE outbox_failure ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0;
