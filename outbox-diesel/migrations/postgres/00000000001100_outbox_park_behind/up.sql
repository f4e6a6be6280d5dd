-- Enqueues now park a keyed message whose key has a pending message already; messages enqueued
-- before that are parked here once, so that no claim meets them.
UPDATE outbox_message m SET parked = TRUE
WHERE NOT m.parked AND m.ordering_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox_message e WHERE e.ordering_key = m.ordering_key AND e.id < m.id);
