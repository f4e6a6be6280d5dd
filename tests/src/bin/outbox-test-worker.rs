//! A worker process for tests that kill it; see `outbox_tests::worker_process`.

fn main() {
    outbox_tests::worker_process::run_from_env()
}
