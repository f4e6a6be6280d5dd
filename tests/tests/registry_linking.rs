//! The linker gotcha the documentation warns about, kept as a test so the warning stays true:
//! this test binary depends on `outbox-second-crate` but never names it, so the crate is not
//! linked and its handler is missing. `registry.rs` shows the fix, `use outbox_second_crate as _;`.

use outbox_diesel::Registry;

#[test]
fn a_handler_crate_nothing_names_is_not_linked() {
    let registry = Registry::from_inventory().unwrap();
    assert!(
        registry.get("second_crate.ping").is_none(),
        "the linker kept an unreferenced crate; if that is now reliable, the advice to write \
         `use my_handlers as _;` can be softened"
    );
}
