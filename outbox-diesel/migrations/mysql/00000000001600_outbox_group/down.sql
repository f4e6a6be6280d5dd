DROP TABLE outbox_group;
ALTER TABLE outbox_failure DROP COLUMN group_name;
ALTER TABLE outbox_message DROP INDEX outbox_message_grouped, DROP COLUMN group_due,
    DROP COLUMN group_name;
