DROP TABLE outbox_admin_revoked;
