//! The blog's tables, and one connection type for whichever database `DATABASE_URL` names.

use diesel::prelude::*;
use diesel::r2d2::{Pool, PooledConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use outbox_diesel::OutboxManager;

/// Declares `AnyConnection` over the backends compiled in (the derive takes no `#[cfg]`s).
macro_rules! any_connection {
    ($($variant:ident($connection:ty)),+) => {
        /// A connection to SQLite, or to PostgreSQL or MySQL when built with their features.
        #[derive(diesel::MultiConnection)]
        #[allow(missing_debug_implementations)]
        pub enum AnyConnection {
            $(
                #[allow(missing_docs)]
                $variant($connection),
            )+
        }
    };
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
any_connection!(
    Postgres(PgConnection),
    Mysql(MysqlConnection),
    Sqlite(SqliteConnection)
);
#[cfg(all(feature = "postgres", not(feature = "mysql")))]
any_connection!(Postgres(PgConnection), Sqlite(SqliteConnection));
#[cfg(all(not(feature = "postgres"), feature = "mysql"))]
any_connection!(Mysql(MysqlConnection), Sqlite(SqliteConnection));
#[cfg(all(not(feature = "postgres"), not(feature = "mysql")))]
any_connection!(Sqlite(SqliteConnection));

// The outbox writes through the very connection (and transaction) the blog's queries use, and
// `OutboxManager` opens only the variant the URL's scheme names (`AnyConnection::establish`
// would try each backend in turn, and an unreachable server would quietly become an SQLite
// file named after its URL).
outbox_diesel::impl_outbox_connection!(AnyConnection {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    Mysql,
    Sqlite,
});

/// The one pool of the blog: its web handlers and the outbox worker share it. The manager
/// opens the backend `DATABASE_URL`'s scheme names, with the settings the outbox needs.
pub type DbPool = Pool<OutboxManager<AnyConnection>>;
/// One pooled connection.
pub type DbConn = PooledConnection<OutboxManager<AnyConnection>>;

diesel::table! {
    members (id) {
        id -> Integer,
        name -> Text,
        email -> Text,
    }
}

diesel::table! {
    posts (id) {
        id -> Integer,
        title -> Text,
        body -> Text,
    }
}

diesel::table! {
    comments (id) {
        id -> Integer,
        post_id -> Integer,
        member_id -> Integer,
        body -> Text,
        created_at -> BigInt,
    }
}

diesel::table! {
    subscriptions (post_id, member_id) {
        post_id -> Integer,
        member_id -> Integer,
    }
}

diesel::table! {
    deliveries (id) {
        id -> Integer,
        webhook_id -> Text,
        message_type -> Text,
        outcome -> Text,
        body -> Text,
        received_at -> BigInt,
    }
}

diesel::joinable!(comments -> members (member_id));
diesel::allow_tables_to_appear_in_same_query!(members, posts, comments, subscriptions, deliveries);

const SQLITE: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
#[cfg(feature = "postgres")]
const POSTGRES: EmbeddedMigrations = embed_migrations!("migrations/postgres");
#[cfg(feature = "mysql")]
const MYSQL: EmbeddedMigrations = embed_migrations!("migrations/mysql");

/// Creates the blog's tables and the outbox's, whichever exist already.
pub fn migrate(conn: &mut AnyConnection) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match conn {
        AnyConnection::Sqlite(c) => {
            c.run_pending_migrations(SQLITE)?;
        }
        #[cfg(feature = "postgres")]
        AnyConnection::Postgres(c) => {
            c.run_pending_migrations(POSTGRES)?;
        }
        #[cfg(feature = "mysql")]
        AnyConnection::Mysql(c) => {
            c.run_pending_migrations(MYSQL)?;
        }
    }
    outbox_diesel::run_migrations(conn)?;
    Ok(())
}

/// A post as shown.
#[derive(Debug, Clone, Queryable)]
pub struct Post {
    /// Its id.
    pub id: i32,
    /// Its title.
    pub title: String,
    /// Its text.
    pub body: String,
}

/// A comment as shown, with its author.
#[derive(Debug, Clone, Queryable)]
pub struct ShownComment {
    /// The author's name.
    pub author: String,
    /// The text.
    pub body: String,
    /// Unix seconds.
    pub created_at: i64,
}

/// A line of the receiver's log.
#[derive(Debug, Clone, Queryable)]
pub struct Delivery {
    /// Its id.
    pub id: i32,
    /// The `webhook-id` header: the outbox message id.
    pub webhook_id: String,
    /// The message type from the body.
    pub message_type: String,
    /// What the receiver made of it.
    pub outcome: String,
    /// The body as received.
    pub body: String,
    /// Unix seconds.
    pub received_at: i64,
}

/// The post and its comments, oldest first.
pub fn post_page(
    conn: &mut AnyConnection,
    post_id: i32,
) -> QueryResult<Option<(Post, Vec<ShownComment>)>> {
    let Some(post) = posts::table.find(post_id).first::<Post>(conn).optional()? else {
        return Ok(None);
    };
    let shown = comments::table
        .inner_join(members::table)
        .filter(comments::post_id.eq(post_id))
        .order(comments::id)
        .select((members::name, comments::body, comments::created_at))
        .load::<ShownComment>(conn)?;
    Ok(Some((post, shown)))
}

/// Deletes all but the `keep` latest deliveries of the receiver's log.
pub fn keep_latest_deliveries(conn: &mut AnyConnection, keep: i64) -> QueryResult<usize> {
    let newest_dropped: Option<i32> = deliveries::table
        .select(deliveries::id)
        .order(deliveries::id.desc())
        .offset(keep)
        .first(conn)
        .optional()?;
    match newest_dropped {
        Some(id) => diesel::delete(deliveries::table.filter(deliveries::id.le(id))).execute(conn),
        None => Ok(0),
    }
}

/// The newest deliveries first.
pub fn recent_deliveries(conn: &mut AnyConnection, limit: i64) -> QueryResult<Vec<Delivery>> {
    deliveries::table
        .order(deliveries::id.desc())
        .limit(limit)
        .load(conn)
}

/// What a log line of a reader's hook says it was: `verified, at hook <hook>`.
pub fn hook_outcome(hook: &str) -> String {
    format!("verified, at hook {hook}")
}

/// The newest deliveries that arrived verified at the hooks of post `post_id`'s readers.
pub fn hook_deliveries(
    conn: &mut AnyConnection,
    post_id: i32,
    limit: i64,
) -> QueryResult<Vec<Delivery>> {
    // Hooks are named `post-<id>-<tag>`: the trailing dash keeps post 1 from matching post 11.
    let pattern = format!("{}%", hook_outcome(&format!("post-{post_id}-")));
    deliveries::table
        .filter(deliveries::outcome.like(pattern))
        .order(deliveries::id.desc())
        .limit(limit)
        .load(conn)
}
