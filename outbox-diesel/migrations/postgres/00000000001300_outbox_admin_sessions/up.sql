-- Admin sessions ended by a sign-out, kept until they would have expired: every replica of the
-- admin pages refuses a copied cookie of a session that signed out.
CREATE TABLE outbox_admin_revoked (
    session_id VARCHAR(64) NOT NULL PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
