//! The store conformance kit (`outbox_core::testing::store_kit`) run on every store of the
//! workspace: the in-memory `MemoryStore` the worker's own tests use, and `DieselStore` on
//! PostgreSQL, MariaDB and SQLite.

use std::time::Duration;

use outbox_core::testing::store_kit::{KitRow, StoreHarness};
use outbox_core::testing::MemoryStore;
use outbox_diesel::admin::{dead_letters, pending_messages, ListOptions};
use outbox_diesel::{DieselStore, Enqueue, EnqueueOptions, Message, OutboxManager};
use outbox_testkit::{Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Conformance {
    n: u32,
    pad: String,
}

impl Message for Conformance {
    const MESSAGE_TYPE: &'static str = "conformance.message";
}

fn payload(n: u32, size: usize) -> Conformance {
    Conformance {
        n,
        pad: "x".repeat(size),
    }
}

/// The in-memory store, on a clock the checks move, lending 4 connections.
struct Memory(MemoryStore);

impl StoreHarness for Memory {
    type Store = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.0
    }

    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64 {
        self.0.enqueue_message(&payload(n, size), key)
    }

    fn rows(&self) -> Vec<KitRow> {
        let now = self.0.now();
        self.0
            .rows()
            .into_iter()
            .map(|r| KitRow {
                position: r.position,
                attempts: r.attempts,
                leased: r.locked_by.is_some() && r.due > now,
                last_error: r.last_error,
            })
            .collect()
    }

    fn dead(&self) -> Vec<(i64, String)> {
        self.0
            .dead_letters()
            .into_iter()
            .map(|d| (d.row.position, d.error))
            .collect()
    }

    fn pass(&self, by: Duration) {
        self.0.advance(by);
    }

    fn max_connections(&self) -> Option<usize> {
        Some(4)
    }
}

fn memory() -> Memory {
    let store = MemoryStore::with_manual_clock();
    store.set_max_connections(Some(4));
    Memory(store)
}

struct Diesel<C: TestConnection> {
    pool: TestPool<C>,
    store: DieselStore<OutboxManager<C>>,
    /// Kept for as long as the check runs.
    _db: TestDb,
}

impl<C: TestConnection> StoreHarness for Diesel<C> {
    type Store = DieselStore<OutboxManager<C>>;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64 {
        let mut options = EnqueueOptions::new();
        if let Some(key) = key {
            options = options.ordering_key(key);
        }
        let id = payload(n, size)
            .enqueue_with(&mut self.pool.get().unwrap(), &options)
            .unwrap();
        self.all_rows()
            .into_iter()
            .find(|m| m.message_id == id)
            .unwrap()
            .position
    }

    fn rows(&self) -> Vec<KitRow> {
        self.all_rows()
            .into_iter()
            .map(|m| KitRow {
                position: m.position,
                attempts: m.attempts,
                leased: m.in_flight,
                last_error: m.last_error,
            })
            .collect()
    }

    fn dead(&self) -> Vec<(i64, String)> {
        dead_letters(
            &mut self.pool.get().unwrap(),
            &ListOptions::new().limit(1000),
        )
        .unwrap()
        .into_iter()
        .map(|d| (d.position, d.last_error))
        .collect()
    }

    fn pass(&self, by: Duration) {
        std::thread::sleep(by);
    }

    fn max_connections(&self) -> Option<usize> {
        Some(POOL_SIZE)
    }
}

/// The pool each Diesel harness gives its store.
const POOL_SIZE: usize = 5;

impl<C: TestConnection> Diesel<C> {
    /// A harness over a database of its own on `backend`'s server, if it can be reached
    /// (else the test database says which variable to set; with `CI=true` it fails).
    fn connect(backend: Backend) -> Option<Self> {
        let db = TestDb::new(backend)?;
        let pool = db.pool::<C>(POOL_SIZE as u32);
        Some(Diesel {
            store: DieselStore::new(pool.clone()),
            pool,
            _db: db,
        })
    }

    fn all_rows(&self) -> Vec<outbox_diesel::admin::PendingMessage> {
        pending_messages(
            &mut self.pool.get().unwrap(),
            &ListOptions::new().limit(1000),
        )
        .unwrap()
    }
}

mod memory {
    outbox_core::store_conformance!(super::memory());
}

mod postgres {
    use super::*;
    outbox_core::store_conformance!(optional Diesel::<diesel::PgConnection>::connect(Backend::Postgres));
}

mod mysql {
    use super::*;
    outbox_core::store_conformance!(optional Diesel::<diesel::MysqlConnection>::connect(Backend::Mysql));
}

mod sqlite {
    use super::*;
    outbox_core::store_conformance!(optional Diesel::<diesel::SqliteConnection>::connect(Backend::Sqlite));
}
