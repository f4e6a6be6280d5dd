-- The notification says from when the committed messages are due (the transaction's clock, which
-- no message enqueued in it precedes): a worker reading the due index from a cursor steps back to
-- it, so a transaction that commits after claims passed its messages' due time is not missed.
CREATE OR REPLACE FUNCTION outbox_message_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_message', ((EXTRACT(EPOCH FROM now()) * 1000000)::BIGINT)::TEXT);
    RETURN NULL;
END
$$;
