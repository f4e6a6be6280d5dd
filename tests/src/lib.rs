//! The outbox's integration tests and fault drills: what they share beyond the test kit
//! (`outbox-testkit`): the handlers, the delivery checker, and the worker process the drills
//! and crash tests kill.

pub mod brokers;
pub mod checker;
pub mod handlers;
pub mod worker_process;
