use outbox_diesel::outbox_handler;

#[outbox_handler("comment.thankYou")]
#[derive(serde::Serialize, serde::Deserialize)]
enum ThankYou {
    Member(i64),
}

fn main() {}
