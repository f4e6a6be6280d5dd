//! Posting a comment: one transaction for the comment, the subscription, and every message.

use std::time::{SystemTime, UNIX_EPOCH};

use diesel::prelude::*;
use outbox_diesel::{Batch, EnqueueOptions};

use crate::db::{comments, members, posts, subscriptions, AnyConnection};
use crate::messages::{post_owner, CommentPosted, Notification, ThankYou};

/// A comment as submitted.
#[derive(Debug, Clone, rocket::FromForm)]
pub struct NewComment {
    /// The author's name.
    pub name: String,
    /// The author's address: members are known by it.
    pub email: String,
    /// The text.
    pub body: String,
}

/// What posting did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// Whether it was the author's first comment (a thank-you is on its way).
    pub first_comment: bool,
    /// How many subscribers are being notified.
    pub notified: usize,
}

/// Why a comment was not saved.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The form is incomplete.
    #[error("{0}")]
    Invalid(&'static str),
    /// No such post.
    #[error("no such post")]
    NoPost,
    /// The database or the outbox failed; nothing was saved.
    #[error(transparent)]
    Outbox(#[from] outbox_diesel::Error),
}

impl From<diesel::result::Error> for PostError {
    fn from(error: diesel::result::Error) -> Self {
        PostError::Outbox(error.into())
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn excerpt(text: &str) -> String {
    let mut short: String = text.chars().take(80).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// Stores the comment, subscribes its author to the post, and enqueues a notification for
/// every other subscriber, on a first comment a thank-you, and a `comment.posted` event for the
/// post's webhook subscriptions: all or nothing.
///
/// The transaction reads before it writes, so it is a `write_transaction`: on SQLite it takes
/// the write lock first, and the worker committing in between cannot make it fail.
pub fn post_comment(
    conn: &mut AnyConnection,
    post_id: i32,
    comment: &NewComment,
) -> Result<Posted, PostError> {
    let (name, email, body) = (
        comment.name.trim(),
        comment.email.trim().to_lowercase(),
        comment.body.trim(),
    );
    if name.is_empty() || body.is_empty() || !email.contains('@') {
        return Err(PostError::Invalid(
            "please give your name, an email address and a comment",
        ));
    }
    outbox_diesel::write_transaction(conn, |conn| {
        let post_title: String = posts::table
            .find(post_id)
            .select(posts::title)
            .first(conn)
            .optional()?
            .ok_or(PostError::NoPost)?;

        let existing: Option<i32> = members::table
            .filter(members::email.eq(&email))
            .select(members::id)
            .first(conn)
            .optional()?;
        let member_id = match existing {
            Some(id) => id,
            None => {
                diesel::insert_into(members::table)
                    .values((members::name.eq(name), members::email.eq(&email)))
                    .execute(conn)?;
                members::table
                    .filter(members::email.eq(&email))
                    .select(members::id)
                    .first(conn)?
            }
        };
        let first_comment = existing.is_none()
            || !diesel::select(diesel::dsl::exists(
                comments::table.filter(comments::member_id.eq(member_id)),
            ))
            .get_result::<bool>(conn)?;

        diesel::insert_into(comments::table)
            .values((
                comments::post_id.eq(post_id),
                comments::member_id.eq(member_id),
                comments::body.eq(body),
                comments::created_at.eq(now()),
            ))
            .execute(conn)?;

        let subscribers: Vec<(i32, String)> = subscriptions::table
            .inner_join(members::table.on(members::id.eq(subscriptions::member_id)))
            .filter(subscriptions::post_id.eq(post_id))
            .select((members::id, members::email))
            .load(conn)?;
        if !subscribers.iter().any(|(id, _)| *id == member_id) {
            diesel::insert_into(subscriptions::table)
                .values((
                    subscriptions::post_id.eq(post_id),
                    subscriptions::member_id.eq(member_id),
                ))
                .execute(conn)?;
        }

        let mut batch = Batch::new();
        let others: Vec<&String> = subscribers
            .iter()
            .filter(|(id, _)| *id != member_id)
            .map(|(_, email)| email)
            .collect();
        for subscriber in &others {
            batch.push(&Notification {
                email: (*subscriber).clone(),
                post_id,
                post_title: post_title.clone(),
                commenter: name.to_owned(),
                excerpt: excerpt(body),
            })?;
        }
        if first_comment {
            // Keyed by member: should they ever get several messages, they arrive in order.
            batch.push_with(
                &ThankYou {
                    member_id,
                    name: name.to_owned(),
                    email: email.clone(),
                    post_title: post_title.clone(),
                },
                &EnqueueOptions::new().ordering_key(format!("member-{member_id}")),
            )?;
        }
        // Keyed by post: each subscription gets a post's comments in the order they were
        // posted.
        batch.push_with(
            &CommentPosted {
                post_id,
                post_title: post_title.clone(),
                commenter: name.to_owned(),
                excerpt: excerpt(body),
            },
            &EnqueueOptions::new()
                .owner(post_owner(post_id))
                .ordering_key(post_owner(post_id)),
        )?;
        batch.enqueue(conn)?;
        Ok(Posted {
            first_comment,
            notified: others.len(),
        })
    })
}
