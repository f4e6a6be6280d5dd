//! The listener: waits on the store's notifications (PostgreSQL `LISTEN`) and wakes the
//! claimer; reconnects by itself after losing its connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::store::Listener;

use super::backoff::{Backoff, Failures};
use super::shared::Shared;
use super::timing::{LISTEN_RETRY, LISTEN_WAIT};
use super::vitals::AliveGuard;

pub(crate) fn run(shared: Arc<Shared>, listener: Box<dyn Listener>, wake: Sender<()>) {
    let _alive = AliveGuard::new(&shared.vitals.listener_alive);
    let mut listener = Some(listener);
    let mut failures = Failures::new(Backoff::from_pair(LISTEN_RETRY));
    let mut listening = true;
    while listening && !shared.stopping() {
        shared.survive("listener", Duration::from_millis(100), || {
            match listener.as_mut() {
                Some(current) => match current.wait(LISTEN_WAIT) {
                    Ok(woken) => {
                        failures.succeeded();
                        if woken {
                            let _ = wake.try_send(());
                        }
                    }
                    Err(error) => {
                        // Let the broken connection go before taking another: a pool sized
                        // for the worker has no spare one.
                        listener = None;
                        let pause = failures.failed();
                        log::warn!(
                            "outbox: lost the notification connection (polling meanwhile, \
                             reconnecting in {pause:?}): {error}"
                        );
                        sleep_unless_stopping(&shared, pause);
                    }
                },
                None => match shared.store.listen() {
                    Ok(Some(fresh)) => {
                        log::info!("outbox: listening for new messages again");
                        listener = Some(fresh);
                        failures.succeeded();
                        // Commits may have happened while nobody listened.
                        let _ = wake.try_send(());
                    }
                    Ok(None) => listening = false,
                    Err(error) => {
                        let pause = failures.failed();
                        log::warn!(
                            "outbox: reconnecting the listener failed (trying again in \
                             {pause:?}): {error}"
                        );
                        sleep_unless_stopping(&shared, pause);
                    }
                },
            }
        });
    }
}

/// Sleeps for `pause`, or less if the worker is asked to stop meanwhile.
fn sleep_unless_stopping(shared: &Shared, pause: Duration) {
    let until = Instant::now() + pause;
    while !shared.stopping() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
