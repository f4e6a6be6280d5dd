-- Claims now park in bulk what waits behind a key's head; messages enqueued before are parked
-- here once, so that no claim meets them.
UPDATE outbox_message o JOIN outbox_message e
    ON e.ordering_key = o.ordering_key AND e.id < o.id
SET o.parked = 1
WHERE o.parked = 0;
