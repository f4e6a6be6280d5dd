CREATE TABLE members (
    id SERIAL PRIMARY KEY,
    name VARCHAR(100) NOT NULL,
    email VARCHAR(255) NOT NULL UNIQUE
);

CREATE TABLE posts (
    id SERIAL PRIMARY KEY,
    title VARCHAR(200) NOT NULL,
    body TEXT NOT NULL
);

CREATE TABLE comments (
    id SERIAL PRIMARY KEY,
    post_id INTEGER NOT NULL REFERENCES posts (id),
    member_id INTEGER NOT NULL REFERENCES members (id),
    body TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE subscriptions (
    post_id INTEGER NOT NULL REFERENCES posts (id),
    member_id INTEGER NOT NULL REFERENCES members (id),
    PRIMARY KEY (post_id, member_id)
);

-- The built-in receiver's log: what the stand-in mail service got.
CREATE TABLE deliveries (
    id SERIAL PRIMARY KEY,
    webhook_id VARCHAR(255) NOT NULL,
    message_type VARCHAR(255) NOT NULL,
    outcome VARCHAR(255) NOT NULL,
    body TEXT NOT NULL,
    received_at BIGINT NOT NULL
);

INSERT INTO posts (title, body) VALUES (
    'Why every web app needs an outbox',
    'Saving a comment and sending a mail are two systems. Do the call after the commit and a crash loses the mail; do it inside the transaction and a slow mail server holds your locks. Write the mail into an outbox table in the same transaction, and let a worker deliver it. Comment below: your first comment earns you a thank-you.'
);
