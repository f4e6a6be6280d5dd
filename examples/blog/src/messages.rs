//! What the blog tells the world, and how: each message delivers itself to the mail webhook.

use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{outbox_handler, Context, Handler, ProcessError};
use serde::{Deserialize, Serialize};

/// Thank a member for their first comment ever.
#[outbox_handler("comment.thankYou")]
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

impl Handler for ThankYou {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.resource::<WebhookEndpoint>()?.deliver(ctx, &self)
    }
}

/// Tell a subscriber of a post that someone else commented.
#[outbox_handler("comment.notification")]
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

impl Handler for Notification {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.resource::<WebhookEndpoint>()?.deliver(ctx, &self)
    }
}
