ALTER TABLE outbox_message RESET (fillfactor);
UPDATE outbox_message SET next_attempt_at = leased_until WHERE leased_until > next_attempt_at;
ALTER TABLE outbox_message DROP COLUMN leased_until;
