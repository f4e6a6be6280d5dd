//! What the other side of a delivery answered ([`Answer`]): what a destination reports and the
//! delivery log keeps. Public as `destination::Answer`.

/// The most of an answer the delivery log keeps, in bytes: enough for an error's message, not
/// a page of HTML.
pub const MAX_ANSWER_BYTES: usize = 512;

/// What the other side of a delivery answered: an HTTP status and the start of the response
/// body, a broker's acknowledgement. Kept in the delivery log beside the attempt, so it must
/// not contain secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    status: Option<u16>,
    text: String,
}

impl Answer {
    /// An answer with a status code (HTTP's) and text, cut to [`MAX_ANSWER_BYTES`] at a
    /// character boundary, NUL characters replaced (text columns refuse them).
    pub fn new(status: Option<u16>, text: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.contains('\0') {
            text = text.replace('\0', "\u{FFFD}");
        }
        if text.len() > MAX_ANSWER_BYTES {
            let mut end = MAX_ANSWER_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        Answer { status, text }
    }

    /// An HTTP answer: its status, and its body decoded lossily.
    pub fn http(status: u16, body: &[u8]) -> Self {
        let body = &body[..body.len().min(MAX_ANSWER_BYTES)];
        Answer::new(Some(status), String::from_utf8_lossy(body))
    }

    /// The status code, where the transport has one.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The start of what the other side answered.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_cut_to_its_bound_at_a_character_boundary() {
        let long = "é".repeat(MAX_ANSWER_BYTES);
        let answer = Answer::new(Some(500), long);
        assert!(answer.text().len() <= MAX_ANSWER_BYTES);
        assert!(answer.text().len() > MAX_ANSWER_BYTES - 2);
        assert!(answer.text().chars().all(|c| c == 'é'));
        let http = Answer::http(404, &[b'x'; 4 * MAX_ANSWER_BYTES]);
        assert_eq!(
            (http.status(), http.text().len()),
            (Some(404), MAX_ANSWER_BYTES)
        );
        let binary = Answer::http(200, b"ok\0\0");
        assert_eq!(binary.text(), "ok\u{FFFD}\u{FFFD}");
    }
}
