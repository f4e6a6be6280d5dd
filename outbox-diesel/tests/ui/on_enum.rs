use outbox_diesel::outbox_handler;
use outbox_diesel::prelude::*;

#[outbox_handler("comment.thankYou")]
#[derive(serde::Serialize, serde::Deserialize)]
enum ThankYou {
    Member(i64),
}

fn thank(conn: &mut diesel::SqliteConnection) {
    // The message is still usable: the attribute's mistake is the only error.
    let _ = ThankYou::Member(7).enqueue(conn);
}

fn main() {}
