use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use crate::parse::HandlerAttr;

pub fn expand(attr: &HandlerAttr, item: TokenStream) -> TokenStream {
    let HandlerAttr {
        message_type,
        ident,
    } = attr;
    let name = ident.to_string();
    // Spanned at the struct's name, so a missing `impl Handler` is reported there.
    let registration = quote_spanned! {ident.span()=>
        ::outbox_diesel::__private::inventory::submit! {
            ::outbox_diesel::__private::HandlerRegistration::new::<#ident>(
                ::core::concat!(::core::module_path!(), "::", #name)
            )
        }
    };
    quote! {
        #item

        impl ::outbox_diesel::__private::Message for #ident {
            const MESSAGE_TYPE: &'static str = #message_type;
        }

        #registration
    }
}

/// Keeps the item so the user sees the one real error, not a cascade of "cannot find type".
pub fn fallback(item: TokenStream, error: syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    quote! {
        #item
        #error
    }
}
