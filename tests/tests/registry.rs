//! The registry `#[outbox_handler]` fills at link time.

// Without this line the linker drops the crate, and its handlers with it (see registry_linking.rs).
use outbox_second_crate as _;

use outbox_diesel::{
    outbox_handler, Context, Delivery, DispatchError, FailureKind, Handler, Message, MessageId,
    ProcessError, Registry, Resources,
};
use serde::{Deserialize, Serialize};

#[outbox_handler("comment.thankYou")]
#[derive(Debug, Serialize, Deserialize)]
struct ThankYou {
    member_id: i64,
}

impl Handler for ThankYou {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let greeted = ctx.resource::<std::sync::Mutex<Vec<i64>>>()?;
        greeted.lock().unwrap().push(self.member_id);
        if self.member_id < 0 {
            return Err(ProcessError::permanent("no such member"));
        }
        Ok(())
    }
}

fn delivery(message_type: &str) -> Delivery {
    Delivery {
        message_id: MessageId::new(),
        message_type: message_type.into(),
        attempt: 1,
        headers: Default::default(),
        ordering_key: None,
        priority: Default::default(),
    }
}

#[test]
fn handlers_are_found_by_type_string_including_another_crates() {
    let registry = Registry::from_inventory().unwrap();
    let types = registry.message_types();
    assert!(types.contains(&"comment.thankYou"), "{types:?}");
    assert!(types.contains(&"second_crate.ping"), "{types:?}");
    assert_eq!(registry.len(), types.len());

    let thank_you = registry.get(ThankYou::MESSAGE_TYPE).unwrap();
    assert_eq!(thank_you.handler_name(), "registry::ThankYou");
    let ping = registry.get("second_crate.ping").unwrap();
    assert_eq!(ping.handler_name(), "outbox_second_crate::Ping");
    assert!(registry.get("comment.unknown").is_none());
}

#[test]
fn dispatch_deserializes_and_runs_the_handler() {
    let registry = Registry::from_inventory().unwrap();
    let handler = registry.get("comment.thankYou").unwrap();
    let resources = Resources::new().with(std::sync::Mutex::new(Vec::<i64>::new()));
    let delivery = delivery("comment.thankYou");

    handler
        .dispatch(
            r#"{"member_id":7}"#.to_owned(),
            &mut Context::new(&delivery, &resources),
        )
        .unwrap();
    let greeted = resources.get::<std::sync::Mutex<Vec<i64>>>().unwrap();
    assert_eq!(*greeted.lock().unwrap(), [7]);

    let refused = handler
        .dispatch(
            r#"{"member_id":-1}"#.to_owned(),
            &mut Context::new(&delivery, &resources),
        )
        .unwrap_err();
    match refused {
        DispatchError::Process(err) => {
            assert_eq!(err.kind(), FailureKind::Permanent);
            assert_eq!(err.reason(), "no such member");
        }
        other => panic!("expected the handler's own failure, got {other:?}"),
    }
}

#[test]
fn a_payload_that_no_longer_fits_the_struct_names_type_and_serde_error() {
    let registry = Registry::from_inventory().unwrap();
    let handler = registry.get("comment.thankYou").unwrap();
    let resources = Resources::new();
    let delivery = delivery("comment.thankYou");
    let err = handler
        .dispatch(
            r#"{"memberId":"seven"}"#.to_owned(),
            &mut Context::new(&delivery, &resources),
        )
        .unwrap_err();
    assert!(matches!(err, DispatchError::Deserialize { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("`comment.thankYou`"), "{text}");
    assert!(text.contains("registry::ThankYou"), "{text}");
    assert!(text.contains("missing field `member_id`"), "{text}");
}
