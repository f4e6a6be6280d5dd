//! The `#[outbox_handler("type.name")]` attribute. Use it through `outbox-diesel`, which
//! re-exports it; the generated code refers to `::outbox_diesel`.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs)]

mod expand;
mod parse;

use proc_macro::TokenStream;

/// Makes a struct an outbox message and registers its handler.
///
/// See `outbox_diesel::outbox_handler` for the documentation.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match parse::HandlerAttr::parse(args.into(), item.clone()) {
        Ok(attr) => expand::expand(&attr, item),
        Err(error) => expand::fallback(item, error),
    }
    .into()
}
