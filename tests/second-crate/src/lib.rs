//! Handlers that live in a crate of their own, as an application's often do.

use outbox_diesel::{outbox_handler, Context, Handler, ProcessError};
use serde::{Deserialize, Serialize};

/// Registered from this crate; found only if the test binary names this crate.
#[outbox_handler("second_crate.ping")]
#[derive(Debug, Serialize, Deserialize)]
pub struct Ping {
    /// Anything.
    pub n: u32,
}

impl Handler for Ping {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}
