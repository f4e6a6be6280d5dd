-- Fairness across groups (`EnqueueOptions::group`, a tenant say): claims give every group with
-- due messages a share of each batch, so one group's flood does not starve the others. The
-- grouped messages have an index of their own (unparked ones, as the due index), which claims
-- read per group; ungrouped messages (most) add nothing to it.
ALTER TABLE outbox_message ADD COLUMN group_name TEXT;
CREATE INDEX outbox_message_grouped ON outbox_message (group_name, next_attempt_at, id)
    WHERE group_name IS NOT NULL AND parked = 0;
-- A dead letter keeps its group for a re-queue.
ALTER TABLE outbox_failure ADD COLUMN group_name TEXT;
-- The groups claims visit, written at enqueue (a conflict writes nothing) and removed by the
-- housekeeper once empty: claims list groups from here, never from the message index, which holds
-- an entry for every grouped message.
CREATE TABLE outbox_group (name TEXT NOT NULL PRIMARY KEY);
