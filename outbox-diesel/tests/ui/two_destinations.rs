use outbox_diesel::outbox_handler;
use outbox_diesel::prelude::*;

#[outbox_handler("comment.thankYou", deliver_to = "mail", deliver_to = "crm")]
#[derive(serde::Serialize, serde::Deserialize)]
struct ThankYou {
    member_id: i64,
}

fn thank(conn: &mut diesel::SqliteConnection) {
    // The message is still usable: the attribute's mistake is the only error.
    let _ = ThankYou { member_id: 7 }.enqueue(conn);
}

fn main() {}
