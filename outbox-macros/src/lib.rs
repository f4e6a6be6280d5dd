//! The `#[outbox_handler("type.name")]` attribute. Use it through `outbox-diesel`, which
//! re-exports it; the generated code refers to `::outbox_diesel`.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs)]

mod expand;
mod parse;
mod valid;

use proc_macro::TokenStream;

/// Makes a struct an outbox message and registers its handler.
///
/// See `outbox_diesel::outbox_handler` for the documentation.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let input = match parse::Input::parse(args.into(), item.clone()) {
        Ok(input) => input,
        Err(error) => return expand::fallback(item, None, error).into(),
    };
    match valid::Handler::validate(&input) {
        Ok(handler) => expand::expand(&handler, item),
        Err(error) => expand::fallback(item, Some(&input), error),
    }
    .into()
}
