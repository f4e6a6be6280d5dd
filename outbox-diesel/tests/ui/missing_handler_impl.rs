use outbox_diesel::outbox_handler;

#[outbox_handler("comment.thankYou")]
#[derive(serde::Serialize, serde::Deserialize)]
struct ThankYou {
    member_id: i64,
}

fn main() {}
