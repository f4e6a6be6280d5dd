use outbox_diesel::outbox_handler;
use outbox_diesel::prelude::*;

#[outbox_handler("comment.thankYou")]
#[derive(serde::Serialize, serde::Deserialize)]
struct ThankYou<T> {
    member: T,
}

fn thank(conn: &mut diesel::SqliteConnection) {
    // The message is still usable: the attribute's mistake is the only error.
    let _ = ThankYou { member: 7_i64 }.enqueue(conn);
}

fn main() {}
