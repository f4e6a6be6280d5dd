use outbox_diesel::outbox_handler;

#[outbox_handler("comment.thankYou")]
fn thank_you(member_id: i64) -> i64 {
    member_id
}

fn main() {
    let _ = thank_you(7);
}
