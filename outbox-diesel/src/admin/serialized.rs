//! The one JSON form of the records operators list: what the admin pages' JSON API and the
//! CLI's `--json` print, so that a script written against one reads the other.
//!
//! Times are RFC 3339 in UTC to the microsecond (`2025-01-31T09:15:02.123456Z`); a payload
//! that is JSON is written as JSON (as the stored text otherwise), under `payload` when it was
//! read whole, and as the text of its first characters under `payload_preview` when a listing
//! [read only those](super::ListOptions::payload_preview); `payload_truncated` says which.

use std::time::SystemTime;

use outbox_core::{Headers, MessageId};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::{BlockedKey, DeadLetter, DestinationStatus, Pause, PendingMessage, TypeStats};
use crate::delivery_log::LoggedAttempt;

/// `time` as RFC 3339 in UTC, to the microsecond.
fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_micros(time).to_string()
}

/// A stored payload as JSON, or as a JSON string when the stored text is not JSON.
fn payload_value(payload: &str) -> Value {
    serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.to_owned()))
}

/// What a pending message and a dead letter share, first: where it is and what it is.
fn message_entries<M: SerializeMap>(
    map: &mut M,
    position: i64,
    message_id: &MessageId,
    message_type: &str,
    ordering_key: Option<&str>,
    attempts: u32,
) -> Result<(), M::Error> {
    map.serialize_entry("position", &position)?;
    map.serialize_entry("message_id", &message_id.to_string())?;
    map.serialize_entry("message_type", message_type)?;
    map.serialize_entry("ordering_key", &ordering_key)?;
    map.serialize_entry("attempts", &attempts)
}

/// What a pending message and a dead letter share, last: what it carries.
fn content_entries<M: SerializeMap>(
    map: &mut M,
    headers: &Headers,
    payload: &str,
    truncated: bool,
) -> Result<(), M::Error> {
    map.serialize_entry("headers", headers)?;
    map.serialize_entry("payload_truncated", &truncated)?;
    if truncated {
        map.serialize_entry("payload_preview", payload)
    } else {
        map.serialize_entry("payload", &payload_value(payload))
    }
}

impl Serialize for PendingMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        let key = self.ordering_key.as_deref();
        message_entries(
            &mut map,
            self.position,
            &self.message_id,
            &self.message_type,
            key,
            self.attempts,
        )?;
        map.serialize_entry("in_flight", &self.in_flight)?;
        map.serialize_entry("parked", &self.parked)?;
        map.serialize_entry("paused", &self.paused)?;
        map.serialize_entry("priority", self.priority.as_str())?;
        map.serialize_entry("group", &self.group)?;
        map.serialize_entry("created_at", &timestamp(self.created_at))?;
        map.serialize_entry("next_attempt_at", &timestamp(self.next_attempt_at))?;
        map.serialize_entry("last_error", &self.last_error)?;
        content_entries(
            &mut map,
            &self.headers,
            &self.payload,
            self.payload_truncated,
        )?;
        map.end()
    }
}

impl Serialize for DeadLetter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        let key = self.ordering_key.as_deref();
        message_entries(
            &mut map,
            self.position,
            &self.message_id,
            &self.message_type,
            key,
            self.attempts,
        )?;
        map.serialize_entry("created_at", &timestamp(self.created_at))?;
        map.serialize_entry("failed_at", &timestamp(self.failed_at))?;
        map.serialize_entry("last_error", &self.last_error)?;
        content_entries(
            &mut map,
            &self.headers,
            &self.payload,
            self.payload_truncated,
        )?;
        map.end()
    }
}

impl Serialize for BlockedKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("ordering_key", &self.ordering_key)?;
        map.serialize_entry("position", &self.position)?;
        map.serialize_entry("message_id", &self.message_id.to_string())?;
        map.serialize_entry("message_type", &self.message_type)?;
        map.serialize_entry("attempts", &self.attempts)?;
        map.serialize_entry("last_error", &self.last_error)?;
        map.serialize_entry("next_attempt_at", &timestamp(self.next_attempt_at))?;
        map.serialize_entry("waiting", &self.waiting)?;
        map.end()
    }
}

impl Serialize for DestinationStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("kind", &self.kind)?;
        map.serialize_entry("state", &self.state)?;
        map.serialize_entry("consecutive_failures", &self.consecutive_failures)?;
        map.serialize_entry("last_error", &self.last_error)?;
        map.serialize_entry("next_probe_at", &self.next_probe_at.map(timestamp))?;
        map.serialize_entry("disabled_reason", &self.disabled_reason)?;
        map.serialize_entry("reported_at", &timestamp(self.reported_at))?;
        map.end()
    }
}

impl Serialize for Pause {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("kind", self.kind.as_str())?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("reason", &self.reason)?;
        map.serialize_entry("paused_at", &timestamp(self.paused_at))?;
        map.end()
    }
}

impl Serialize for TypeStats {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("message_type", &self.message_type)?;
        map.serialize_entry("pending", &self.pending)?;
        map.serialize_entry("in_flight", &self.in_flight)?;
        map.serialize_entry("dead", &self.dead)?;
        map.serialize_entry("oldest_pending", &self.oldest_pending.map(timestamp))?;
        map.end()
    }
}

impl Serialize for crate::subscription::SubscriptionInfo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(12))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("owner", &self.owner)?;
        map.serialize_entry("url", &self.url)?;
        map.serialize_entry("event_types", &self.event_types)?;
        map.serialize_entry("rate_limit", &self.rate_limit)?;
        map.serialize_entry("allow_http", &self.allow_http)?;
        map.serialize_entry("description", &self.description)?;
        map.serialize_entry("metadata", &self.metadata)?;
        map.serialize_entry("enabled", &self.enabled)?;
        map.serialize_entry("created_at", &timestamp(self.created_at))?;
        map.serialize_entry(
            "previous_secret_until",
            &self.previous_secret_until.map(timestamp),
        )?;
        map.serialize_entry("destination", &self.destination)?;
        map.end()
    }
}

impl Serialize for LoggedAttempt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(12))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("message_id", &self.message_id.to_string())?;
        map.serialize_entry("message_type", &self.message_type)?;
        map.serialize_entry("destination", &self.destination)?;
        map.serialize_entry("subscription_id", &self.subscription_id)?;
        map.serialize_entry("attempt", &self.attempt)?;
        map.serialize_entry("outcome", &self.outcome)?;
        map.serialize_entry("status", &self.status)?;
        map.serialize_entry("answer", &self.answer)?;
        map.serialize_entry("error", &self.error)?;
        map.serialize_entry("latency_ms", &self.latency_ms)?;
        map.serialize_entry("started_at", &timestamp(self.started_at))?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use super::*;

    fn letter(payload: &str, truncated: bool) -> DeadLetter {
        DeadLetter {
            position: 7,
            message_id: MessageId::new(),
            message_type: "comment.thankYou".into(),
            payload: payload.into(),
            payload_truncated: truncated,
            ordering_key: None,
            attempts: 3,
            last_error: "HTTP 500".into(),
            created_at: UNIX_EPOCH + Duration::from_micros(1_738_314_902_123_456),
            failed_at: UNIX_EPOCH,
            headers: Headers::new(),
        }
    }

    #[test]
    fn times_are_rfc_3339_to_the_microsecond() {
        let json = serde_json::to_value(letter("{}", false)).unwrap();
        assert_eq!(json["created_at"], "2025-01-31T09:15:02.123456Z");
        assert_eq!(json["failed_at"], "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn whole_payloads_are_json_and_previews_text() {
        let whole = serde_json::to_value(letter(r#"{"n":1}"#, false)).unwrap();
        assert_eq!(whole["payload"], json!({ "n": 1 }));
        assert_eq!(whole["payload_truncated"], false);
        assert!(whole.get("payload_preview").is_none());

        let not_json = serde_json::to_value(letter("not json {", false)).unwrap();
        assert_eq!(not_json["payload"], "not json {");

        let preview = serde_json::to_value(letter(r#"{"n":"#, true)).unwrap();
        assert_eq!(preview["payload_preview"], r#"{"n":"#);
        assert_eq!(preview["payload_truncated"], true);
        assert!(
            preview.get("payload").is_none(),
            "a cut payload is not passed off as whole"
        );
    }
}
