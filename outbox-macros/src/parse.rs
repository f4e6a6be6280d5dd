use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned;
use syn::{Item, LitStr};

/// The longest type string the outbox tables store.
const MAX_TYPE_LEN: usize = 255;

pub struct HandlerAttr {
    pub message_type: LitStr,
    pub ident: syn::Ident,
}

impl HandlerAttr {
    pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
        let message_type = parse_message_type(args)?;
        let ident = parse_struct(item)?;
        Ok(HandlerAttr {
            message_type,
            ident,
        })
    }
}

fn parse_message_type(args: TokenStream) -> syn::Result<LitStr> {
    if args.is_empty() {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[outbox_handler] needs the message type string, e.g. #[outbox_handler(\"comment.thankYou\")]",
        ));
    }
    let lit: LitStr = syn::parse2(args.clone()).map_err(|_| {
        syn::Error::new_spanned(
            &args,
            "expected the message type as one string literal, e.g. #[outbox_handler(\"comment.thankYou\")]",
        )
    })?;
    let value = lit.value();
    if value.is_empty() {
        return Err(syn::Error::new_spanned(
            &lit,
            "the message type must not be empty",
        ));
    }
    if value.len() > MAX_TYPE_LEN {
        return Err(syn::Error::new_spanned(
            &lit,
            format!(
                "the message type is {} bytes long; the outbox stores at most {MAX_TYPE_LEN}",
                value.len()
            ),
        ));
    }
    if let Some(bad) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(syn::Error::new_spanned(
            &lit,
            format!(
                "the message type must not contain whitespace or control characters (found {bad:?})"
            ),
        ));
    }
    Ok(lit)
}

fn parse_struct(item: TokenStream) -> syn::Result<syn::Ident> {
    match syn::parse2::<Item>(item)? {
        Item::Struct(item) => {
            if !item.generics.params.is_empty() {
                return Err(syn::Error::new_spanned(
                    &item.generics,
                    "#[outbox_handler] structs cannot be generic: the worker must know the one \
                     concrete type to deserialize each stored message into",
                ));
            }
            Ok(item.ident)
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
