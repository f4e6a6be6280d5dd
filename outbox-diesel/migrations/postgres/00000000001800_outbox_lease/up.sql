-- A claim's lease in a column outside every index, so that leasing a message rewrites none of
-- its index entries and PostgreSQL can keep the new row version on the same page (a HOT
-- update). The lease used to move the indexed `next_attempt_at`, which made every claimed row a
-- new entry in the due index and the primary key. A leased message keeps its due time; claims
-- skip it while `leased_until` is ahead. Pages are filled to 45 % on insert so that a claim,
-- which leases every row of a page at once, finds room there for each new version.
ALTER TABLE outbox_message ADD COLUMN leased_until TIMESTAMPTZ;
ALTER TABLE outbox_message SET (fillfactor = 45);
