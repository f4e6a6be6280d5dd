DROP TABLE outbox_group;
ALTER TABLE outbox_failure DROP COLUMN group_name;
DROP INDEX outbox_message_grouped;
ALTER TABLE outbox_message DROP COLUMN group_name;
