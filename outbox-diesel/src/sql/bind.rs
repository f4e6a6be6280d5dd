//! Running a statement written in its backend's own placeholders (`$1, $2, …` on PostgreSQL,
//! `?` on MySQL and SQLite) with its binds: [`Prepared`] for fixed texts, which Diesel
//! prepares once per connection and reuses (it never does for `sql_query`), and [`dynamic`]
//! for texts built per call (lists of ids), which it does not keep.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, BoxedSqlQuery, QueryFragment, QueryId, SqlQuery};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Bool, HasSqlType, Nullable, Text};
use diesel::{QueryResult, RunQueryDsl};

/// One bind parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bind<'a> {
    Text(&'a str),
    BigInt(i64),
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Bool(bool),
    NullableText(Option<&'a str>),
    NullableBigInt(Option<i64>),
}

/// How a backend writes its placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placeholders {
    /// `$1`, `$2`, … in order, each once (PostgreSQL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Numbered,
    /// `?` (MySQL, SQLite).
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    Question,
}

/// The text between placeholders: `n + 1` pieces for `n` placeholders.
pub(crate) fn pieces(sql: &str, style: Placeholders) -> Vec<&str> {
    match style {
        Placeholders::Question => sql.split('?').collect(),
        Placeholders::Numbered => {
            let mut pieces = Vec::new();
            let mut rest = sql;
            while let Some(at) = rest.find('$') {
                let digits = rest[at + 1..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len() - at - 1);
                if digits == 0 {
                    // A `$` that starts no placeholder (none of the outbox's statements has one).
                    break;
                }
                pieces.push(&rest[..at]);
                rest = &rest[at + 1 + digits..];
            }
            pieces.push(rest);
            pieces
        }
    }
}

/// The pieces of `sql` around its placeholders, which must be as many as its `binds`.
fn pieces_for(sql: &str, style: Placeholders, binds: usize) -> QueryResult<Vec<&str>> {
    let pieces = pieces(sql, style);
    if pieces.len() != binds + 1 {
        return Err(diesel::result::Error::QueryBuilderError(
            format!(
                "{} placeholders for {binds} binds in: {sql}",
                pieces.len() - 1
            )
            .into(),
        ));
    }
    Ok(pieces)
}

/// A statement of fixed text, kept prepared by Diesel for the connection's lifetime.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    sql: &'static str,
    style: Placeholders,
    binds: &'a [Bind<'a>],
}

impl<'a> Prepared<'a> {
    pub(crate) fn new(sql: &'static str, style: Placeholders, binds: &'a [Bind<'a>]) -> Self {
        Prepared { sql, style, binds }
    }
}

impl<DB> QueryFragment<DB> for Prepared<'_>
where
    DB: Backend + HasSqlType<Text> + HasSqlType<BigInt> + HasSqlType<Bool>,
    str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
    bool: ToSql<Bool, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let pieces = pieces_for(self.sql, self.style, self.binds.len())?;
        for (piece, bind) in pieces.iter().zip(self.binds) {
            out.push_sql(piece);
            match bind {
                Bind::Text(text) => out.push_bind_param::<Text, str>(*text)?,
                Bind::BigInt(n) => out.push_bind_param::<BigInt, i64>(n)?,
                Bind::Bool(b) => out.push_bind_param::<Bool, bool>(b)?,
                Bind::NullableText(text) => out.push_bind_param::<Nullable<Text>, _>(text)?,
                Bind::NullableBigInt(n) => out.push_bind_param::<Nullable<BigInt>, _>(n)?,
            }
        }
        out.push_sql(pieces[pieces.len() - 1]);
        Ok(())
    }
}

impl QueryId for Prepared<'_> {
    type QueryId = ();
    // Cached by its text, not its type: every statement shares this type.
    const HAS_STATIC_QUERY_ID: bool = false;
}

// Rows come back by name (`QueryableByName`), as from `sql_query`.
impl diesel::query_builder::Query for Prepared<'_> {
    type SqlType = diesel::sql_types::Untyped;
}

impl<Conn> RunQueryDsl<Conn> for Prepared<'_> {}

/// One bind parameter of a PostgreSQL statement: an array, or a scalar beside arrays.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum PgBind<'a> {
    TextArray(&'a [&'a str]),
    BigIntArray(&'a [i64]),
    Text(&'a str),
    BigInt(i64),
}

/// A PostgreSQL statement of fixed text with array (and scalar) binds, kept prepared as
/// [`Prepared`] is (`sql_query`, which takes arrays too, is parsed and planned anew on every
/// call).
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) struct PreparedPg<'a> {
    sql: &'static str,
    binds: &'a [PgBind<'a>],
}

#[cfg(feature = "postgres")]
impl<'a> PreparedPg<'a> {
    pub(crate) fn new(sql: &'static str, binds: &'a [PgBind<'a>]) -> Self {
        PreparedPg { sql, binds }
    }
}

#[cfg(feature = "postgres")]
impl QueryFragment<diesel::pg::Pg> for PreparedPg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        use diesel::sql_types::Array;

        let pieces = pieces_for(self.sql, Placeholders::Numbered, self.binds.len())?;
        for (piece, bind) in pieces.iter().zip(self.binds) {
            out.push_sql(piece);
            match bind {
                PgBind::TextArray(texts) => out.push_bind_param::<Array<Text>, _>(texts)?,
                PgBind::BigIntArray(ns) => out.push_bind_param::<Array<BigInt>, _>(ns)?,
                PgBind::Text(text) => out.push_bind_param::<Text, str>(*text)?,
                PgBind::BigInt(n) => out.push_bind_param::<BigInt, i64>(n)?,
            }
        }
        out.push_sql(pieces[pieces.len() - 1]);
        Ok(())
    }
}

#[cfg(feature = "postgres")]
impl QueryId for PreparedPg<'_> {
    type QueryId = ();
    // Cached by its text, as `Prepared` is.
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "postgres")]
impl diesel::query_builder::Query for PreparedPg<'_> {
    type SqlType = diesel::sql_types::Untyped;
}

#[cfg(feature = "postgres")]
impl<Conn> RunQueryDsl<Conn> for PreparedPg<'_> {}

/// A statement whose text was built for this call, with its binds (never kept prepared).
pub(crate) fn dynamic<'a, DB>(sql: &'a str, binds: &[Bind<'a>]) -> BoxedSqlQuery<'a, DB, SqlQuery>
where
    DB: Backend + HasSqlType<Text> + HasSqlType<BigInt> + HasSqlType<Bool>,
    &'a str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
    bool: ToSql<Bool, DB>,
{
    let mut query = diesel::sql_query(sql).into_boxed::<DB>();
    for bind in binds {
        query = match *bind {
            Bind::Text(text) => query.bind::<Text, _>(text),
            Bind::BigInt(n) => query.bind::<BigInt, _>(n),
            Bind::Bool(b) => query.bind::<Bool, _>(b),
            Bind::NullableText(text) => query.bind::<Nullable<Text>, _>(text),
            Bind::NullableBigInt(n) => query.bind::<Nullable<BigInt>, _>(n),
        };
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_split_the_text_in_order() {
        assert_eq!(
            pieces("SELECT $1, $2::uuid, $10", Placeholders::Numbered),
            ["SELECT ", ", ", "::uuid, ", ""]
        );
        assert_eq!(
            pieces("a = ? AND b = ?", Placeholders::Question),
            ["a = ", " AND b = ", ""]
        );
        assert_eq!(pieces("SELECT 1", Placeholders::Numbered), ["SELECT 1"]);
    }
}
