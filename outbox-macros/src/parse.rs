//! Reading the attribute and the item it is on, without judging them (that is `valid`).

use proc_macro2::TokenStream;
use syn::{Item, LitStr};

/// What `#[outbox_handler(ARGS)] ITEM` holds.
pub struct Input {
    /// The attribute's arguments, as written.
    pub args: TokenStream,
    /// The arguments, if they are one string literal.
    pub message_type: Option<LitStr>,
    /// The item the attribute is on.
    pub item: Item,
}

impl Input {
    /// Fails only when the item is not an item at all (the compiler reports that itself).
    pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Input> {
        Ok(Input {
            message_type: syn::parse2(args.clone()).ok(),
            args,
            item: syn::parse2(item)?,
        })
    }
}
