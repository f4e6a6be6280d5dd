//! The one small Tokio runtime an async client library runs on, for the destination's lifetime.

use std::future::Future;

use tokio::runtime::Runtime;

use crate::error::RelayError;

/// A runtime made off any other runtime (Tokio panics when a runtime is made or blocked on
/// inside another's context, which is where a web framework builds its resources) and shut
/// down in the background when dropped (dropping one inside an async context panics too).
#[derive(Debug)]
pub(crate) struct OwnedRuntime(Option<Runtime>);

impl OwnedRuntime {
    /// Builds the runtime, then runs `start` on it (connecting the client), on a thread of
    /// its own.
    pub fn start<T, F>(
        destination: &'static str,
        start: impl FnOnce() -> F + Send,
    ) -> Result<(OwnedRuntime, T), RelayError>
    where
        F: Future<Output = Result<T, RelayError>>,
        T: Send,
    {
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .thread_name(format!("outbox-relay-{destination}"))
                        .enable_all()
                        .build()
                        .map_err(|error| RelayError::Config {
                            destination,
                            reason: format!("cannot start its runtime: {error}"),
                        })?;
                    let started = runtime.block_on(start())?;
                    Ok((OwnedRuntime(Some(runtime)), started))
                })
                .join()
        })
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Runs `future` to completion on the calling thread (a handler thread).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        match &self.0 {
            Some(runtime) => runtime.block_on(future),
            None => unreachable!("the runtime is taken only when dropped"),
        }
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
