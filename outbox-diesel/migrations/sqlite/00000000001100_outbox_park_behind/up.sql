-- Enqueues now park a keyed message whose key has a pending message already; messages enqueued
-- before that are parked here once, so that no claim meets them.
UPDATE outbox_message SET parked = 1
WHERE parked = 0 AND ordering_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox_message e
              WHERE e.ordering_key = outbox_message.ordering_key AND e.id < outbox_message.id);
