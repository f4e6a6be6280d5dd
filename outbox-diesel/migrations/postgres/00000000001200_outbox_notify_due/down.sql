CREATE OR REPLACE FUNCTION outbox_message_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_message', '');
    RETURN NULL;
END
$$;
