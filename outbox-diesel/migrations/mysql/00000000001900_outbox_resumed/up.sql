-- When an operator's pause that held a message last ended. A message waits without spending
-- attempts for a destination that is held or paused for at most `max_deferral`; that bound
-- counts from the later of its enqueue and this, so that the time it spent paused by an
-- operator never counts against it.
ALTER TABLE outbox_message ADD COLUMN resumed_at DATETIME(6) NULL;
