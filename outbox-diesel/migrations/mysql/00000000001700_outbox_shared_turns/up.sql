-- Rate limits across processes (`RateLimit::across_processes`): every worker takes a paced
-- destination's turns from its row here, under the row's lock. The bucket's turns in millionths,
-- and the times in microseconds since the epoch on the database's clock: when the bucket was
-- last filled up, the last turn handed to a deferred message (the line's end), the last turn
-- taken. NULL until a worker takes the first.
ALTER TABLE outbox_destination ADD COLUMN turn_tokens BIGINT;
ALTER TABLE outbox_destination ADD COLUMN turns_refilled BIGINT;
ALTER TABLE outbox_destination ADD COLUMN turns_booked_until BIGINT;
ALTER TABLE outbox_destination ADD COLUMN last_turn BIGINT;
