//! The library's claim statements, as `outbox-diesel` runs them, with the binds written in
//! for `EXPLAIN` (which takes no parameters on MySQL and SQLite).

pub use outbox_diesel::__private::claim_sql::POSTGRES_CLAIMER_SESSION;
use outbox_diesel::__private::claim_sql::{
    candidates, MYSQL_CANDIDATES, POSTGRES_CLAIM, SQLITE_CANDIDATES,
};

/// The PostgreSQL claim of a batch of `limit`, leasing for 60 s under a fixed token.
pub fn pg_claim_sql(limit: usize) -> String {
    let binds = [
        "''".to_owned(),
        "''".to_owned(),
        "0".to_owned(),
        "0".to_owned(),
        "0".to_owned(),
        "0".to_owned(),
        candidates(limit).to_string(),
        limit.to_string(),
        i64::MAX.to_string(),
        "TRUE".to_owned(),
        "'00000000-0000-4000-8000-000000000000'".to_owned(),
        "60000000".to_owned(),
    ];
    // From the highest number down, so that `$1` never matches the start of `$10`.
    binds
        .iter()
        .enumerate()
        .rev()
        .fold(POSTGRES_CLAIM.to_owned(), |sql, (i, value)| {
            sql.replace(&format!("${}", i + 1), value)
        })
}

/// The MySQL claim's first statement, its candidates, for a batch of `limit`.
pub fn mysql_candidates_sql(limit: usize) -> String {
    // Binds in order: the raised priorities' limit, the cursor's due time (the range's bound,
    // then the row's) and id (the start), then the ordinary limit.
    let limit = candidates(limit).to_string();
    [limit.as_str(), "0", "0", "0", limit.as_str()]
        .iter()
        .fold(MYSQL_CANDIDATES.to_owned(), |sql, value| {
            sql.replacen('?', value, 1)
        })
}

/// The SQLite claim's candidates, for a batch of `limit`.
pub fn sqlite_candidates_sql(limit: usize) -> String {
    SQLITE_CANDIDATES.replace('?', &candidates(limit).to_string())
}
