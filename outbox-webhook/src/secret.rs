//! [`WebhookSecret`]: a Standard Webhooks signing secret (`whsec_…`), and the signature it
//! makes.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::WebhookError;

pub(crate) type HmacSha256 = Hmac<Sha256>;

const PREFIX: &str = "whsec_";

/// The length of keys made by [`WebhookSecret::generate`], the minimum Standard Webhooks
/// recommends.
const GENERATED_LEN: usize = 24;

/// The shortest key accepted: 128 bits. A shorter key can be guessed, and anyone who guesses
/// it can forge signatures (an empty one is no key at all).
pub const MIN_SECRET_LEN: usize = 16;

/// A symmetric signing key shared by a webhook sender and its receiver.
///
/// Standard Webhooks writes these as `whsec_` followed by the key in base64; [`parse`] reads
/// that form and [`expose_whsec`] writes it. Neither `Debug` nor any error shows the key, and
/// there is deliberately no `Display`, so a secret cannot end up in a log by accident.
///
/// [`parse`]: WebhookSecret::parse
/// [`expose_whsec`]: WebhookSecret::expose_whsec
#[derive(Clone)]
pub struct WebhookSecret {
    key: Vec<u8>,
}

impl WebhookSecret {
    /// Reads a `whsec_<base64>` secret, as Standard Webhooks providers show them.
    ///
    /// The error never repeats the input.
    pub fn parse(text: &str) -> Result<Self, WebhookError> {
        let encoded = text
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(WebhookError::InvalidSecret {
                reason: "it does not start with `whsec_`",
            })?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| WebhookError::InvalidSecret {
                reason: "the part after `whsec_` is not valid base64",
            })?;
        Self::from_bytes(key)
    }

    /// A secret with the raw key `key`, at least [`MIN_SECRET_LEN`] bytes long.
    ///
    /// The error never repeats the key.
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Result<Self, WebhookError> {
        let key = key.into();
        if key.len() < MIN_SECRET_LEN {
            return Err(WebhookError::InvalidSecret {
                reason: if key.is_empty() {
                    "the key is empty"
                } else {
                    "the key is shorter than 16 bytes, short enough to guess and forge signatures \
                     with; use WebhookSecret::generate"
                },
            });
        }
        Ok(WebhookSecret { key })
    }

    /// A new random 24-byte secret, to hand to a receiver with [`expose_whsec`].
    ///
    /// The bytes come from the operating system's cryptographic generator (`getrandom`).
    ///
    /// # Panics
    ///
    /// If the operating system provides no randomness at all: a signing key must not be made
    /// from anything weaker.
    ///
    /// [`expose_whsec`]: WebhookSecret::expose_whsec
    pub fn generate() -> Self {
        let mut key = [0_u8; GENERATED_LEN];
        if let Err(error) = getrandom::fill(&mut key) {
            panic!("the operating system provides no randomness for a webhook secret: {error}");
        }
        WebhookSecret { key: key.to_vec() }
    }

    /// The secret in its `whsec_<base64>` form, for giving it to the receiver.
    ///
    /// Everything printed from here on is the key itself: store it like a password.
    pub fn expose_whsec(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.key))
    }

    /// The Standard Webhooks signature of one delivery: `v1,` and the base64 HMAC-SHA256 of
    /// `{msg_id}.{timestamp}.{body}`, as sent in the `webhook-signature` header.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    /// A MAC keyed with this secret.
    pub(crate) fn mac(&self) -> HmacSha256 {
        match HmacSha256::new_from_slice(&self.key) {
            Ok(mac) => mac,
            // HMAC hashes long keys and pads short ones, so every length is accepted.
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        }
    }
}

impl FromStr for WebhookSecret {
    type Err = WebhookError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        WebhookSecret::parse(text)
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        let secret = WebhookSecret::parse(VECTOR_SECRET).unwrap();
        let signature = secret.sign(
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            br#"{"email":"test@example.com","username":"test_user"}"#,
        );
        assert_eq!(signature, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    #[test]
    fn parses_and_writes_the_whsec_form() {
        let secret: WebhookSecret = VECTOR_SECRET.parse().unwrap();
        assert_eq!(secret.expose_whsec(), VECTOR_SECRET);
        assert_eq!(
            WebhookSecret::from_bytes(secret.key.clone())
                .unwrap()
                .expose_whsec(),
            VECTOR_SECRET
        );
    }

    #[test]
    fn malformed_secrets_are_refused_without_echoing_them() {
        for bad in [
            "C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "whsec_not*base64!",
            "whsec_",
        ] {
            let err = WebhookSecret::parse(bad).unwrap_err();
            let shown = err.to_string();
            assert!(shown.contains("whsec_"), "{shown}");
            let key_part = bad.trim_start_matches("whsec_");
            assert!(
                key_part.is_empty() || !shown.contains(key_part),
                "the error repeats the secret: {shown}"
            );
        }
    }

    #[test]
    fn empty_and_short_keys_are_refused() {
        for short in [&b""[..], b"k", &[7_u8; MIN_SECRET_LEN - 1]] {
            let err = WebhookSecret::from_bytes(short).unwrap_err();
            assert!(matches!(err, WebhookError::InvalidSecret { .. }), "{err}");
        }
        assert!(WebhookSecret::from_bytes([7_u8; MIN_SECRET_LEN]).is_ok());
        let short_whsec = format!("whsec_{}", STANDARD.encode(b"tiny"));
        assert!(WebhookSecret::parse(&short_whsec).is_err());
    }

    #[test]
    fn generated_secrets_are_24_random_bytes_and_round_trip() {
        let first = WebhookSecret::generate();
        let second = WebhookSecret::generate();
        assert_eq!(first.key.len(), 24);
        assert_ne!(first.key, second.key);
        let again = WebhookSecret::parse(&first.expose_whsec()).unwrap();
        assert_eq!(again.key, first.key);
    }

    #[test]
    fn debug_does_not_show_the_key() {
        let secret = WebhookSecret::parse(VECTOR_SECRET).unwrap();
        let shown = format!("{secret:?}");
        assert_eq!(shown, "WebhookSecret(<redacted>)");
        assert!(!shown.contains("C2FV"));
    }
}
