//! What the blog tells the world: mails are routed to the mail webhook, as they are; a
//! `comment.posted` event goes to every webhook subscription that asks for it, each delivered
//! on its own.

use outbox_diesel::outbox_handler;
use serde::{Deserialize, Serialize};

/// The name the blog's worker gives its mail webhook: messages routed here go to it.
pub const MAIL: &str = "mail";

/// Thank a member for their first comment ever.
#[outbox_handler("comment.thankYou", deliver_to = "mail")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThankYou {
    /// Who to thank.
    pub member_id: i32,
    /// Their name.
    pub name: String,
    /// Where to write.
    pub email: String,
    /// The post they commented on.
    pub post_title: String,
}

/// Tell a subscriber of a post that someone else commented.
#[outbox_handler("comment.notification", deliver_to = "mail")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    /// Where to write.
    pub email: String,
    /// The post.
    pub post_id: i32,
    /// Its title.
    pub post_title: String,
    /// Who commented.
    pub commenter: String,
    /// The start of the comment.
    pub excerpt: String,
}

/// A comment was posted: an event for the webhook subscriptions readers add to the post
/// (`/posts/<id>/webhooks`), owned by the post so that only its own subscriptions take it.
#[outbox_handler("comment.posted", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommentPosted {
    /// The post.
    pub post_id: i32,
    /// Its title.
    pub post_title: String,
    /// Who commented (their name; never their address: readers' endpoints see this).
    pub commenter: String,
    /// The start of the comment.
    pub excerpt: String,
}

/// The owner of a post's events and of the subscriptions that take them.
pub fn post_owner(post_id: i32) -> String {
    format!("post-{post_id}")
}
