ALTER TABLE outbox_destination DROP COLUMN last_turn;
ALTER TABLE outbox_destination DROP COLUMN turns_booked_until;
ALTER TABLE outbox_destination DROP COLUMN turns_refilled;
ALTER TABLE outbox_destination DROP COLUMN turn_tokens;
