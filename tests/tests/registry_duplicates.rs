//! Two handler structs with one type string: the registry refuses to start, naming both.

use outbox_diesel::{outbox_handler, Context, Handler, ProcessError, Registry, RegistryError};
use serde::{Deserialize, Serialize};

mod mail {
    use super::*;

    #[outbox_handler("comment.thankYou")]
    #[derive(Serialize, Deserialize)]
    pub struct ThankYou {
        pub member_id: i64,
    }

    impl Handler for ThankYou {
        fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
            Ok(())
        }
    }
}

mod sms {
    use super::*;

    #[outbox_handler("comment.thankYou")]
    #[derive(Serialize, Deserialize)]
    pub struct ThankYouText {
        pub phone: String,
    }

    impl Handler for ThankYouText {
        fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
            Ok(())
        }
    }
}

#[test]
fn a_type_string_registered_twice_names_both_handlers() {
    let err = Registry::from_inventory().unwrap_err();
    let RegistryError::DuplicateType {
        message_type,
        first,
        second,
    } = &err
    else {
        panic!("expected a duplicate type error, got {err:?}");
    };
    assert_eq!(*message_type, "comment.thankYou");
    assert_eq!(
        [*first, *second],
        [
            "registry_duplicates::mail::ThankYou",
            "registry_duplicates::sms::ThankYouText"
        ]
    );
    let text = err.to_string();
    assert!(
        text.contains("registry_duplicates::mail::ThankYou"),
        "{text}"
    );
    assert!(
        text.contains("registry_duplicates::sms::ThankYouText"),
        "{text}"
    );
}
