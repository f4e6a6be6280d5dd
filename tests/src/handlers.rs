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

/// Hangs on its first attempt for `hang_ms` and then fails it (the watchdog has counted it
/// timed out by then); on a later attempt delivers itself like a [`Hook`].
#[outbox_handler("test.stall")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stall {
    /// The hook it delivers on a later attempt.
    pub hook: Hook,
    /// How long its first attempt hangs.
    pub hang_ms: u64,
}

impl Handler for Stall {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if ctx.attempt() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(self.hang_ms));
            return Err(ProcessError::retryable("stalled on purpose"));
        }
        ctx.resource::<WebhookEndpoint>()?.deliver(ctx, &self.hook)
    }
}
