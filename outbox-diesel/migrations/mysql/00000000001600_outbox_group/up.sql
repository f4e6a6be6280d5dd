-- Fairness across groups (`EnqueueOptions::group`, a tenant say): claims give every group with
-- due messages a share of each batch, so one group's flood does not starve the others. Claims
-- read the grouped messages per group by this index, from the claim cursor on. MySQL has no
-- partial index: every message has an entry here, ungrouped ones under NULL. The due time is
-- indexed as `group_due`, NULL for ungrouped messages, so that their leases and retries (which
-- move `next_attempt_at`) leave this index alone.
ALTER TABLE outbox_message
    ADD COLUMN group_name VARCHAR(255),
    ADD COLUMN group_due DATETIME(6)
        AS (CASE WHEN group_name IS NOT NULL THEN next_attempt_at END) VIRTUAL,
    ADD INDEX outbox_message_grouped (group_name, parked, group_due, id);
-- A dead letter keeps its group for a re-queue.
ALTER TABLE outbox_failure ADD COLUMN group_name VARCHAR(255);
-- The groups claims visit, written at enqueue (a duplicate writes nothing) and removed by the
-- housekeeper once empty: claims list groups from here, never from the message index, where a
-- drained group's entries would be walked while purge is held back.
CREATE TABLE outbox_group (
    name VARCHAR(255) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
