//! In-process wake-ups: an enqueue in this process nudges the workers running in it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_channel::Sender;

static LISTENERS: Mutex<Vec<(usize, Sender<()>)>> = Mutex::new(Vec::new());
static COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// Tells every worker of this process that a message was just enqueued. Cheap when no worker
/// runs (one atomic load); never blocks.
pub fn notify_enqueued() {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    if let Ok(listeners) = LISTENERS.lock() {
        for (_, wake) in listeners.iter() {
            let _ = wake.try_send(());
        }
    }
}

/// Keeps a worker subscribed while alive.
#[derive(Debug)]
pub(crate) struct Subscription(usize);

pub(crate) fn subscribe(wake: Sender<()>) -> Subscription {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut listeners) = LISTENERS.lock() {
        listeners.push((id, wake));
        COUNT.store(listeners.len(), Ordering::Relaxed);
    }
    Subscription(id)
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Ok(mut listeners) = LISTENERS.lock() {
            listeners.retain(|(id, _)| *id != self.0);
            COUNT.store(listeners.len(), Ordering::Relaxed);
        }
    }
}
