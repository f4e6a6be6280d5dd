//! The code a valid attribute generates, and what an invalid one still generates so that the
//! user sees one error, not a cascade.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Item;

use crate::parse::Input;
use crate::valid::Handler;

/// The item, its `Message` impl, and its registration with the worker.
pub fn expand(handler: &Handler, item: TokenStream) -> TokenStream {
    let Handler {
        message_type,
        ident,
        deliver_to,
    } = handler;
    let name = ident.to_string();
    // Spanned at the struct's name, so a missing `impl Handler` is reported there.
    let registration = match deliver_to {
        None => quote_spanned! {ident.span()=>
            ::outbox_diesel::__private::inventory::submit! {
                ::outbox_diesel::__private::HandlerRegistration::new::<#ident>(
                    ::core::concat!(::core::module_path!(), "::", #name)
                )
            }
        },
        // Routed: the message goes to its destination as it is; no `Handler` to implement.
        Some(destination) => quote_spanned! {ident.span()=>
            ::outbox_diesel::__private::inventory::submit! {
                ::outbox_diesel::__private::HandlerRegistration::routed::<#ident>(
                    ::core::concat!(::core::module_path!(), "::", #name),
                    #destination
                )
            }
        },
    };
    quote! {
        #item

        impl ::outbox_diesel::__private::Message for #ident {
            const MESSAGE_TYPE: &'static str = #message_type;
        }

        #registration
    }
}

/// The item and the error, plus the `Message` impl where the item can have one: code that
/// enqueues the message then compiles, and the attribute's mistake is the only error. No
/// registration, so no second error about a missing `Handler`.
pub fn fallback(item: TokenStream, input: Option<&Input>, error: syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    let message_impl = input.and_then(message_impl);
    quote! {
        #item
        #error
        #message_impl
    }
}

fn message_impl(input: &Input) -> Option<TokenStream> {
    let (ident, generics) = match &input.item {
        Item::Struct(item) => (&item.ident, &item.generics),
        Item::Enum(item) => (&item.ident, &item.generics),
        _ => return None,
    };
    let message_type = input
        .message_type()
        .map(|lit| lit.value())
        .unwrap_or_default();
    let (impl_generics, type_generics, where_clause) = generics.split_for_impl();
    let mut predicates = where_clause
        .map(|clause| clause.predicates.clone())
        .unwrap_or_default();
    predicates.push(syn::parse_quote! {
        Self: ::outbox_diesel::__private::serde::Serialize
            + ::outbox_diesel::__private::serde::de::DeserializeOwned
            + ::core::marker::Send
            + 'static
    });
    Some(quote! {
        impl #impl_generics ::outbox_diesel::__private::Message for #ident #type_generics
        where
            #predicates
        {
            const MESSAGE_TYPE: &'static str = #message_type;
        }
    })
}
