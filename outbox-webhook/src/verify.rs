//! The receiver's side: checking that a webhook came from the holder of a secret, recently.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::Mac as _;

use super::secret::WebhookSecret;

/// How far a webhook's timestamp may be from the receiver's clock, in either direction, as
/// Standard Webhooks recommends: five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Read access to the headers of a received request, by case-insensitive name.
///
/// Implemented for `http`/`reqwest` [`HeaderMap`](reqwest::header::HeaderMap) (what hyper, axum
/// and actix-web's `http` integration hand out), for `HashMap<String, String>`, and for slices,
/// arrays and vectors of name–value pairs.
pub trait WebhookHeaders {
    /// The value of the header `name` (matched ignoring ASCII case), if present and text.
    fn header(&self, name: &str) -> Option<&str>;
}

impl WebhookHeaders for reqwest::header::HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|value| value.to_str().ok())
    }
}

impl<S: BuildHasher> WebhookHeaders for HashMap<String, String, S> {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name)
            .or_else(|| {
                self.iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(name))
                    .map(|(_, value)| value)
            })
            .map(String::as_str)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> WebhookHeaders for [(K, V)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(key, _)| key.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> WebhookHeaders for [(K, V); N] {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> WebhookHeaders for Vec<(K, V)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

/// A webhook whose signature and timestamp checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedWebhook {
    /// The `webhook-id`: the same on every retry of one message, so use it to drop duplicates.
    pub id: String,
    /// The `webhook-timestamp`, in seconds since the Unix epoch.
    pub timestamp: i64,
}

/// Why a received webhook was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// One of the three Standard Webhooks headers is absent (or not text).
    #[error(
        "the webhook has no `{name}` header; Standard Webhooks senders send webhook-id, \
         webhook-timestamp and webhook-signature (check that a proxy does not strip them)"
    )]
    MissingHeader {
        /// The missing header.
        name: &'static str,
    },

    /// `webhook-timestamp` is not a whole number of seconds.
    #[error(
        "the webhook-timestamp header `{value}` is not a number of seconds since the Unix epoch"
    )]
    MalformedTimestamp {
        /// The header's value, cut to 40 characters.
        value: String,
    },

    /// The timestamp is further in the past than the tolerance: a replay, or a delivery held up.
    #[error(
        "the webhook was signed {age:?} ago, more than the tolerated {tolerance:?}; it may be \
         a replay (if deliveries are merely slow, check both clocks or raise the tolerance)"
    )]
    TimestampTooOld {
        /// How long ago it was signed.
        age: Duration,
        /// The tolerance it was checked against.
        tolerance: Duration,
    },

    /// The timestamp is further in the future than the tolerance: a clock is off.
    #[error(
        "the webhook's timestamp is {ahead:?} in the future, more than the tolerated \
         {tolerance:?}; check the sender's and the receiver's clocks"
    )]
    TimestampTooNew {
        /// How far ahead of the receiver's clock it is.
        ahead: Duration,
        /// The tolerance it was checked against.
        tolerance: Duration,
    },

    /// No `v1` signature matches the id, timestamp and body under any of the secrets.
    #[error(
        "none of the {signatures} v1 signature(s) in webhook-signature matches under any of the \
         {secrets} secret(s); check that the secret is the sender's for this endpoint and that \
         the body is verified exactly as received, before any parsing or re-serializing"
    )]
    NoValidSignature {
        /// How many `v1,` signatures the header held.
        signatures: usize,
        /// How many secrets were tried.
        secrets: usize,
    },
}

/// Checks a received webhook against the receiver's secrets, with the system clock: see
/// [`verify_at`].
pub fn verify(
    secrets: &[WebhookSecret],
    headers: &(impl WebhookHeaders + ?Sized),
    body: &[u8],
    tolerance: Duration,
) -> Result<VerifiedWebhook, VerifyError> {
    verify_at(secrets, headers, body, tolerance, SystemTime::now())
}

/// Checks a received webhook as of `now`: the `webhook-id`, `webhook-timestamp` and
/// `webhook-signature` headers are present, the timestamp is within `tolerance` of `now` in
/// either direction, and at least one `v1,` signature in the header matches the raw `body`
/// under one of `secrets` (compared in constant time).
///
/// Pass several secrets while rotating keys; [`DEFAULT_TOLERANCE`] is the usual tolerance.
/// `body` must be the bytes as received: parsing and re-serializing JSON changes them.
pub fn verify_at(
    secrets: &[WebhookSecret],
    headers: &(impl WebhookHeaders + ?Sized),
    body: &[u8],
    tolerance: Duration,
    now: SystemTime,
) -> Result<VerifiedWebhook, VerifyError> {
    let required = |name: &'static str| {
        headers
            .header(name)
            .ok_or(VerifyError::MissingHeader { name })
    };
    let id = required("webhook-id")?;
    let timestamp_text = required("webhook-timestamp")?;
    let signatures = required("webhook-signature")?;

    let timestamp: i64 =
        timestamp_text
            .trim()
            .parse()
            .map_err(|_| VerifyError::MalformedTimestamp {
                value: timestamp_text.chars().take(40).collect(),
            })?;
    check_age(timestamp, tolerance, now)?;

    let candidates: Vec<Vec<u8>> = signatures
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .collect();
    // The sender signed the header's text, which is what is checked (not a reformatted number).
    let signed_timestamp = timestamp_text.trim();
    let matches = secrets.iter().any(|secret| {
        let mut mac = secret.mac();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(signed_timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        candidates
            .iter()
            .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    });
    if !matches {
        return Err(VerifyError::NoValidSignature {
            signatures: signatures
                .split_ascii_whitespace()
                .filter(|entry| entry.starts_with("v1,"))
                .count(),
            secrets: secrets.len(),
        });
    }
    Ok(VerifiedWebhook {
        id: id.to_owned(),
        timestamp,
    })
}

fn check_age(timestamp: i64, tolerance: Duration, now: SystemTime) -> Result<(), VerifyError> {
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(since_epoch) => i128::from(since_epoch.as_secs()),
        Err(before_epoch) => -i128::from(before_epoch.duration().as_secs()),
    };
    let age = now - i128::from(timestamp);
    let seconds = |value: i128| Duration::from_secs(u64::try_from(value).unwrap_or(u64::MAX));
    if age > i128::from(tolerance.as_secs()) {
        Err(VerifyError::TimestampTooOld {
            age: seconds(age),
            tolerance,
        })
    } else if -age > i128::from(tolerance.as_secs()) {
        Err(VerifyError::TimestampTooNew {
            ahead: seconds(-age),
            tolerance,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TIMESTAMP: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn at(seconds: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap())
    }

    fn headers(signature: &str) -> Vec<(String, String)> {
        vec![
            ("Webhook-Id".into(), ID.into()),
            ("webhook-timestamp".into(), TIMESTAMP.to_string()),
            ("WEBHOOK-SIGNATURE".into(), signature.into()),
        ]
    }

    fn secret() -> WebhookSecret {
        WebhookSecret::parse(SECRET).unwrap()
    }

    #[test]
    fn accepts_the_standard_webhooks_test_vector() {
        let verified = verify_at(
            &[secret()],
            &headers(SIGNATURE),
            BODY,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP),
        )
        .unwrap();
        assert_eq!(
            verified,
            VerifiedWebhook {
                id: ID.into(),
                timestamp: TIMESTAMP
            }
        );
    }

    #[test]
    fn accepts_when_any_signature_matches_any_secret() {
        let other = WebhookSecret::from_bytes(*b"an older key, being rotated out").unwrap();
        let listed = format!("v1a,c29tZXRoaW5n v1,bm90IGl0 {SIGNATURE}");
        let verified = verify_at(
            &[other, secret()],
            &headers(&listed),
            BODY,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP + 30),
        );
        assert_eq!(verified.unwrap().id, ID);
    }

    #[test]
    fn rejects_stale_and_future_timestamps() {
        let tolerance = Duration::from_secs(300);
        let stale = verify_at(
            &[secret()],
            &headers(SIGNATURE),
            BODY,
            tolerance,
            at(TIMESTAMP + 301),
        );
        assert_eq!(
            stale.unwrap_err(),
            VerifyError::TimestampTooOld {
                age: Duration::from_secs(301),
                tolerance
            }
        );
        let future = verify_at(
            &[secret()],
            &headers(SIGNATURE),
            BODY,
            tolerance,
            at(TIMESTAMP - 301),
        )
        .unwrap_err();
        assert!(
            matches!(future, VerifyError::TimestampTooNew { ahead, .. } if ahead == Duration::from_secs(301))
        );
        assert!(future.to_string().contains("clocks"), "{future}");
        assert!(verify_at(
            &[secret()],
            &headers(SIGNATURE),
            BODY,
            tolerance,
            at(TIMESTAMP + 300)
        )
        .is_ok());
    }

    #[test]
    fn rejects_a_tampered_body_and_a_wrong_secret() {
        let tampered = br#"{"email":"test@example.com","username":"test_user2"}"#;
        let err = verify_at(
            &[secret()],
            &headers(SIGNATURE),
            tampered,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP),
        )
        .unwrap_err();
        assert_eq!(
            err,
            VerifyError::NoValidSignature {
                signatures: 1,
                secrets: 1
            }
        );
        assert!(!err.to_string().contains("C2FV"));

        let wrong = WebhookSecret::from_bytes(*b"some other receiver's key").unwrap();
        let err = verify_at(
            &[wrong],
            &headers(SIGNATURE),
            BODY,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP),
        );
        assert!(matches!(err, Err(VerifyError::NoValidSignature { .. })));

        let err = verify_at(
            &[secret()],
            &headers("v1,not base64!"),
            BODY,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP),
        );
        assert!(matches!(err, Err(VerifyError::NoValidSignature { .. })));
    }

    #[test]
    fn rejects_missing_headers_and_malformed_timestamps() {
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let partial: Vec<(String, String)> = headers(SIGNATURE)
                .into_iter()
                .filter(|(key, _)| !key.eq_ignore_ascii_case(name))
                .collect();
            let err = verify_at(
                &[secret()],
                &partial,
                BODY,
                DEFAULT_TOLERANCE,
                at(TIMESTAMP),
            )
            .unwrap_err();
            assert_eq!(err, VerifyError::MissingHeader { name });
            assert!(err.to_string().contains(name));
        }

        let err = verify_at(
            &[secret()],
            &[
                ("webhook-id", ID),
                ("webhook-timestamp", "yesterday"),
                ("webhook-signature", SIGNATURE),
            ],
            BODY,
            DEFAULT_TOLERANCE,
            at(TIMESTAMP),
        )
        .unwrap_err();
        assert_eq!(
            err,
            VerifyError::MalformedTimestamp {
                value: "yesterday".into()
            }
        );
    }

    #[test]
    fn header_maps_are_read_ignoring_case() {
        let mut map = reqwest::header::HeaderMap::new();
        map.insert("Webhook-Id", ID.parse().unwrap());
        assert_eq!(map.header("webhook-id"), Some(ID));
        assert_eq!(map.header("WEBHOOK-ID"), Some(ID));

        let hash: HashMap<String, String> = [("Webhook-Timestamp".to_owned(), "1".to_owned())]
            .into_iter()
            .collect();
        assert_eq!(hash.header("webhook-timestamp"), Some("1"));
        assert_eq!(hash.header("webhook-id"), None);

        let pairs: &[(&str, &str)] = &[("webhook-signature", "v1,x")];
        assert_eq!(pairs.header("Webhook-Signature"), Some("v1,x"));
    }
}
