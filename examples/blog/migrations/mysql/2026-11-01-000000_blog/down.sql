DROP TABLE deliveries;
DROP TABLE subscriptions;
DROP TABLE comments;
DROP TABLE posts;
DROP TABLE members;
