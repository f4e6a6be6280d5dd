//! Sharing the health of the worker's webhook endpoints through the store: what one worker
//! learns (a `410 Gone`) and what an operator decides (enable, disable) reaches every worker
//! within a few seconds and survives restarts, and the CLI and admin pages can show it.

use std::collections::HashMap;
use std::time::Instant;

use crate::metrics;
use crate::store::Store;
use crate::webhook::WebhookEndpoint;

use super::timing::HOUSEKEEPING_EVERY;

/// The endpoints given to [`WorkerBuilder::webhook`](super::WorkerBuilder::webhook), synced
/// with the store when the worker starts and every few seconds after.
#[derive(Debug, Default)]
pub(crate) struct EndpointSync {
    endpoints: Vec<WebhookEndpoint>,
    /// The operator's count of enables of each endpoint when this worker last read it.
    enables_seen: HashMap<String, i64>,
    next: Option<Instant>,
}

impl EndpointSync {
    /// Adds an endpoint; a second one of the same name is the same endpoint to the store, so
    /// only the first is synced.
    pub fn add(&mut self, endpoint: WebhookEndpoint) {
        if !self.endpoints.iter().any(|e| e.name() == endpoint.name()) {
            self.endpoints.push(endpoint);
        }
    }

    /// Syncs if it is time: first before the worker's first claim, so that an endpoint
    /// disabled before a restart gets no delivery.
    pub fn run(&mut self, store: &dyn Store) {
        let now = Instant::now();
        if self.endpoints.is_empty() || self.next.is_some_and(|next| now < next) {
            return;
        }
        self.next = Some(now + HOUSEKEEPING_EVERY);
        let names: Vec<&str> = self.endpoints.iter().map(WebhookEndpoint::name).collect();
        let (endpoints, enables_seen) = (&self.endpoints, &mut self.enables_seen);
        let synced = store.sync_endpoints(&names, &mut |stored| {
            for record in stored {
                if let Some(endpoint) = endpoints.iter().find(|e| e.name() == record.name) {
                    endpoint.adopt(record, enables_seen.get(&record.name).copied());
                    enables_seen.insert(record.name.clone(), record.enables);
                }
            }
            endpoints
                .iter()
                .map(WebhookEndpoint::store_report)
                .collect()
        });
        if let Err(error) = synced {
            metrics::store_error("housekeeping");
            log::warn!(
                "outbox: sharing the webhook endpoints' health through the store failed: {error}"
            );
        }
    }
}
