//! Error texts as the store keeps them.

use super::timing::{MAX_ERROR_LEN, MAX_REDUCED_ERROR_LEN};

/// Makes an error text storable: bounded in length, and without NUL characters, which
/// PostgreSQL's text columns refuse.
pub(crate) fn storable(text: String) -> String {
    let mut text = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    };
    if text.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The text reduced to what any database encoding stores: printable ASCII, short. For a
/// database that refused the text as it was (a `LATIN1` or `SQL_ASCII` PostgreSQL refuses
/// characters it cannot encode).
pub(crate) fn reduced(text: &str) -> String {
    let mut out = String::with_capacity(MAX_REDUCED_ERROR_LEN + 3);
    for c in text.chars() {
        if out.len() >= MAX_REDUCED_ERROR_LEN {
            out.push_str("...");
            break;
        }
        match c {
            '…' => out.push_str("..."),
            ' '..='~' => out.push(c),
            c if c.is_whitespace() => out.push(' '),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_on_a_char_boundary_and_nul_is_replaced() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = storable(long);
        assert!(cut.len() <= MAX_ERROR_LEN + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(storable("a\0b".into()), "a\u{FFFD}b");
        assert_eq!(storable("short".into()), "short");
    }

    #[test]
    fn reduced_texts_are_short_printable_ascii() {
        assert_eq!(
            reduced("webhook http://h/… answered 500: Ошибка\n\0"),
            "webhook http://h/... answered 500: ?????? ?"
        );
        let long = reduced(&"x".repeat(10_000));
        assert_eq!(long.len(), MAX_REDUCED_ERROR_LEN + 3);
        assert!(long.bytes().all(|b| (b' '..=b'~').contains(&b)));
    }
}
