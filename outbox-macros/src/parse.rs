//! Reading the attribute and the item it is on, without judging them (that is `valid`).

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Item, LitStr, Token};

/// What `#[outbox_handler(ARGS)] ITEM` holds.
pub struct Input {
    /// The attribute's arguments, as written.
    pub args: TokenStream,
    /// The arguments as a string literal followed by `name = "value"` settings, or why they
    /// are not.
    pub parsed: syn::Result<Args>,
    /// The item the attribute is on.
    pub item: Item,
}

/// `"type.name"` and its options, as written.
pub struct Args {
    pub message_type: LitStr,
    pub options: Vec<Setting>,
}

/// One `name = "value"` option.
pub struct Setting {
    pub name: syn::Ident,
    pub value: LitStr,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let message_type: LitStr = input.parse()?;
        let mut options = Vec::new();
        if input.parse::<Option<Token![,]>>()?.is_some() {
            let rest = Punctuated::<Setting, Token![,]>::parse_terminated(input)?;
            options.extend(rest);
        }
        Ok(Args {
            message_type,
            options,
        })
    }
}

impl Parse for Setting {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: syn::Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let value: LitStr = input.parse()?;
        Ok(Setting { name, value })
    }
}

impl Input {
    /// Fails only when the item is not an item at all (the compiler reports that itself).
    pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Input> {
        Ok(Input {
            parsed: syn::parse2(args.clone()),
            args,
            item: syn::parse2(item)?,
        })
    }

    /// The message type string, if the arguments start with one.
    pub fn message_type(&self) -> Option<&LitStr> {
        self.parsed.as_ref().ok().map(|args| &args.message_type)
    }
}
