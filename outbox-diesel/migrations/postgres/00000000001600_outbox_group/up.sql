-- Fairness across groups (`EnqueueOptions::group`, a tenant say): claims give every group with
-- due messages a share of each batch, so one group's flood does not starve the others. The
-- grouped messages have an index of their own (unparked ones, as the due index), which claims
-- read per group from the claim cursor on; ungrouped messages (most) add nothing to it.
ALTER TABLE outbox_message ADD COLUMN group_name VARCHAR(255);
CREATE INDEX outbox_message_grouped ON outbox_message (group_name, next_attempt_at, id)
    WHERE group_name IS NOT NULL AND NOT parked;
-- A dead letter keeps its group for a re-queue.
ALTER TABLE outbox_failure ADD COLUMN group_name VARCHAR(255);
-- The groups claims visit, written at enqueue (a conflict writes nothing) and removed by the
-- housekeeper once empty: claims list groups from here, never from the message index, where a
-- drained group's dead entries would be walked behind a held transaction.
CREATE TABLE outbox_group (name VARCHAR(255) NOT NULL PRIMARY KEY);
