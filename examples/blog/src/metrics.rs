//! The worker's metrics for Prometheus: the outbox records them through the `metrics` facade,
//! and the blog installs a Prometheus recorder (without its HTTP server or a runtime of its own)
//! and renders it at `/metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_diesel::metrics::{ATTEMPT_DURATION, DELIVERY_LAG, DESTINATION_DURATION};

/// Buckets for handler durations and delivery lag, in seconds: from a fast local handler to a
/// message that waited out a long outage.
const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0,
];

/// The process's Prometheus recorder, installed on first use. A process has one global
/// recorder, so every blog built in this process (the tests build several) shares it; `None`
/// if another recorder was installed first.
pub fn recorder() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let installed = [ATTEMPT_DURATION, DELIVERY_LAG, DESTINATION_DURATION]
                .into_iter()
                .try_fold(PrometheusBuilder::new(), |builder, name| {
                    builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), &SECONDS_BUCKETS)
                })
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => Some(handle),
                Err(error) => {
                    log::warn!("blog: no /metrics: {error}");
                    None
                }
            }
        })
        .clone()
}
