//! Handlers shared by the test binaries and the test worker process.

use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{outbox_handler, Context, Handler, ProcessError};
use serde::{Deserialize, Serialize};

/// Delivers itself to the worker's webhook endpoint.
#[outbox_handler("test.hook")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hook {
    /// A number the receiver can check.
    pub n: u32,
    /// The ordering key it was enqueued with, if any.
    pub key: Option<String>,
}

impl Hook {
    /// A hook without a key.
    pub fn new(n: u32) -> Hook {
        Hook { n, key: None }
    }
}

impl Handler for Hook {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.resource::<WebhookEndpoint>()?.deliver(ctx, &self)
    }
}
