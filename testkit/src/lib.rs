//! What the outbox's tests, fault drills, benchmarks and the example's tests share, written
//! once:
//!
//! - [`db`]: a database of its own for each test on the real PostgreSQL, MariaDB or SQLite,
//!   dropped afterwards, and pools of it; loud when a server is missing, fatal under `CI=true`.
//! - [`http`]: a real HTTP/1.1 receiver on 127.0.0.1 that answers as scripted and counts
//!   webhook ids.
//! - [`outbox`]: the test signing secret and endpoint, pending messages and dead letters.
//! - [`proxy`]: a TCP proxy a test can make stop forwarding (a connection whose peer vanished).
//! - [`eventually`], and the macros [`backend_tests!`] (one `#[test]` per backend) and
//!   [`with_connection!`] (a connection type chosen at run time).
//!
//! Not published; a dev-dependency of the workspace's own crates.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod db;
pub mod http;
pub mod outbox;
pub mod proxy;

use std::time::{Duration, Instant};

pub use db::{TestConnection, TestDb, TestPool};
pub use diesel;
pub use outbox_diesel::Backend;

/// Prints `log` records on stderr, with the time since start and the thread, when the
/// environment variable `var` names a level (`debug`, `info`, ...): for diagnosing drills and
/// benchmarks, not for measuring.
pub fn log_to_stderr_from_env(var: &str) {
    struct Stderr {
        started: Instant,
    }

    impl log::Log for Stderr {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }

        fn log(&self, record: &log::Record<'_>) {
            eprintln!(
                "[{:>10.3} ms {:<5} {}] {}",
                self.started.elapsed().as_secs_f64() * 1000.0,
                record.level(),
                std::thread::current().name().unwrap_or("?"),
                record.args()
            );
        }

        fn flush(&self) {}
    }

    let Some(level) = std::env::var(var)
        .ok()
        .and_then(|level| level.parse::<log::LevelFilter>().ok())
    else {
        return;
    };
    let logger = Box::leak(Box::new(Stderr {
        started: Instant::now(),
    }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

/// Polls `condition` every 5 ms until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, condition: impl FnMut() -> bool) -> bool {
    eventually_every(Duration::from_millis(5), timeout, condition)
}

/// Polls `condition` every `interval` until it holds or `timeout` passes; returns whether it
/// held.
pub fn eventually_every(
    interval: Duration,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(interval);
    }
}

/// Declares one `#[test]` per backend for each listed generic test function, in modules
/// `postgres`, `mysql` and `sqlite`. Each function takes `&TestDb` and is generic over the
/// connection type; where a server is unreachable outside CI the test says so and passes.
#[macro_export]
macro_rules! backend_tests {
    ($($test:ident),* $(,)?) => {
        $crate::backend_tests!(@module postgres, Postgres, $crate::diesel::PgConnection, $($test),*);
        $crate::backend_tests!(@module mysql, Mysql, $crate::diesel::MysqlConnection, $($test),*);
        $crate::backend_tests!(@module sqlite, Sqlite, $crate::diesel::SqliteConnection, $($test),*);
    };
    (@module $module:ident, $backend:ident, $connection:ty, $($test:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::$backend) {
                        super::$test::<$connection>(&db);
                    }
                }
            )*
        }
    };
}

/// Runs `$body` with `$c` naming the Diesel connection type of `$backend` (a
/// [`Backend`] value known only at run time).
#[macro_export]
macro_rules! with_connection {
    ($backend:expr, $c:ident => $body:expr) => {
        match $backend {
            $crate::Backend::Postgres => {
                type $c = $crate::diesel::PgConnection;
                $body
            }
            $crate::Backend::Mysql => {
                type $c = $crate::diesel::MysqlConnection;
                $body
            }
            $crate::Backend::Sqlite => {
                type $c = $crate::diesel::SqliteConnection;
                $body
            }
        }
    };
}
