//! Every mistake a user can make with `#[outbox_handler]` gives one clear compile error.

#[test]
fn outbox_handler_misuse() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
