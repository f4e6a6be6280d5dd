//! What makes an `#[outbox_handler]` valid: one string literal the tables can store, on a
//! struct the worker can deserialize into.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Item, LitStr};

use crate::parse::Input;

/// The longest type string the outbox tables store.
const MAX_TYPE_LEN: usize = 255;

/// The longest destination name a worker accepts.
const MAX_DESTINATION_LEN: usize = 255;

/// A valid handler: the checked type string, the struct's name, and the destination it is
/// routed to, if it is.
pub struct Handler {
    pub message_type: LitStr,
    pub ident: syn::Ident,
    pub deliver_to: Option<LitStr>,
}

impl Handler {
    /// Checks the input; the error points at the offending token.
    pub fn validate(input: &Input) -> syn::Result<Handler> {
        let message_type = message_type(input)?;
        let deliver_to = deliver_to(input)?;
        let ident = message_struct(&input.item)?;
        Ok(Handler {
            message_type,
            ident,
            deliver_to,
        })
    }
}

fn deliver_to(input: &Input) -> syn::Result<Option<LitStr>> {
    let mut deliver_to = None;
    for option in input.parsed.iter().flat_map(|args| &args.options) {
        if option.name != "deliver_to" {
            return Err(syn::Error::new_spanned(
                &option.name,
                format!(
                    "unknown option `{}`; the one option is `deliver_to = \"destination\"`, \
                     which delivers the message as it is to that destination of the worker",
                    option.name
                ),
            ));
        }
        if deliver_to.is_some() {
            return Err(syn::Error::new_spanned(
                &option.name,
                "`deliver_to` is given twice; a message type goes to one destination",
            ));
        }
        let name = option.value.value();
        if name.is_empty() || name.chars().count() > MAX_DESTINATION_LEN {
            return Err(syn::Error::new_spanned(
                &option.value,
                format!("a destination name is 1 to {MAX_DESTINATION_LEN} characters"),
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(syn::Error::new_spanned(
                &option.value,
                "a destination name has no control characters",
            ));
        }
        deliver_to = Some(option.value.clone());
    }
    Ok(deliver_to)
}

fn message_type(input: &Input) -> syn::Result<LitStr> {
    if input.args.is_empty() {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[outbox_handler] needs the message type string, e.g. #[outbox_handler(\"comment.thankYou\")]",
        ));
    }
    let Some(lit) = input.message_type() else {
        let starts_with_a_string =
            syn::parse2::<LitStr>(input.args.clone().into_iter().take(1).collect()).is_ok();
        if let (true, Err(error)) = (starts_with_a_string, &input.parsed) {
            // The type string is there; what follows it is not a `name = "value"` setting.
            return Err(syn::Error::new(
                error.span(),
                format!(
                    "{error}: after the message type, give `deliver_to = \"destination\"`, \
                     e.g. #[outbox_handler(\"comment.thankYou\", deliver_to = \"mail\")]"
                ),
            ));
        }
        return Err(syn::Error::new_spanned(
            &input.args,
            "expected the message type as a string literal, optionally followed by \
             `deliver_to = \"destination\"`, e.g. #[outbox_handler(\"comment.thankYou\")]",
        ));
    };
    let value = lit.value();
    if value.is_empty() {
        return Err(syn::Error::new_spanned(
            lit,
            "the message type must not be empty",
        ));
    }
    if value.len() > MAX_TYPE_LEN {
        return Err(syn::Error::new_spanned(
            lit,
            format!(
                "the message type is {} bytes long; the outbox stores at most {MAX_TYPE_LEN}",
                value.len()
            ),
        ));
    }
    if let Some(bad) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(syn::Error::new_spanned(
            lit,
            format!(
                "the message type must not contain whitespace or control characters (found {bad:?})"
            ),
        ));
    }
    Ok(lit.clone())
}

fn message_struct(item: &Item) -> syn::Result<syn::Ident> {
    match item {
        Item::Struct(item) => {
            if !item.generics.params.is_empty() {
                return Err(syn::Error::new_spanned(
                    &item.generics,
                    "#[outbox_handler] structs cannot be generic: the worker must know the one \
                     concrete type to deserialize each stored message into",
                ));
            }
            Ok(item.ident.clone())
        }
        Item::Enum(item) => Err(not_a_struct(item.enum_token.span(), "an enum")),
        Item::Fn(item) => Err(not_a_struct(item.sig.fn_token.span(), "a function")),
        other => Err(not_a_struct(other.span(), "this item")),
    }
}

fn not_a_struct(span: Span, what: &str) -> syn::Error {
    syn::Error::new(
        span,
        format!(
            "#[outbox_handler] goes on the struct that is the message, not on {what}; \
             wrap the data in a struct deriving Serialize and Deserialize"
        ),
    )
}
