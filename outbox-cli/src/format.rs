//! Times, durations and payloads, for people and for JSON.

use std::time::{Duration, SystemTime};

use serde_json::Value;

/// A duration in its two largest units: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m{:02}s", s / 60, s % 60),
        3_600..=86_399 => format!("{}h{:02}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// How long ago `then` was, saturating at zero for times in the future.
pub fn age(then: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or_default()
}

/// `then` relative to `now`: `in 30s`, `3m12s ago`, or `now` within a second.
pub fn relative(then: SystemTime, now: SystemTime) -> String {
    const NOW: Duration = Duration::from_secs(1);
    match then.duration_since(now) {
        Ok(ahead) if ahead >= NOW => format!("in {}", duration(ahead)),
        Ok(_) => "now".to_owned(),
        Err(behind) if behind.duration() >= NOW => format!("{} ago", duration(behind.duration())),
        Err(_) => "now".to_owned(),
    }
}

/// `time` as RFC 3339 in UTC, to the second: `2025-01-31T09:15:02Z`.
pub fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `time` as RFC 3339 in UTC, to the microsecond: `2025-01-31T09:15:02.123456Z`.
pub fn timestamp_micros(time: SystemTime) -> String {
    humantime::format_rfc3339_micros(time).to_string()
}

/// A stored payload pretty-printed, or the raw text when it is not JSON.
pub fn payload_pretty(payload: &str) -> String {
    serde_json::from_str::<Value>(payload)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| payload.to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn durations_are_short() {
        assert_eq!(duration(Duration::from_millis(400)), "0s");
        assert_eq!(duration(Duration::from_secs(45)), "45s");
        assert_eq!(duration(Duration::from_secs(192)), "3m12s");
        assert_eq!(duration(Duration::from_secs(7_500)), "2h05m");
        assert_eq!(
            duration(Duration::from_secs(3 * 86_400 + 4 * 3_600 + 5)),
            "3d04h"
        );
    }

    #[test]
    fn relative_times_read_naturally() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(relative(now + Duration::from_secs(30), now), "in 30s");
        assert_eq!(relative(now - Duration::from_secs(192), now), "3m12s ago");
        assert_eq!(relative(now + Duration::from_millis(300), now), "now");
        assert_eq!(relative(now - Duration::from_millis(300), now), "now");
        assert_eq!(age(now + Duration::from_secs(5), now), Duration::ZERO);
    }

    #[test]
    fn timestamps_are_rfc_3339_utc() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // 2024-02-29 23:59:58.5 UTC: a leap day.
        let leap = UNIX_EPOCH + Duration::from_micros(1_709_251_198_500_000);
        assert_eq!(timestamp(leap), "2024-02-29T23:59:58Z");
        assert_eq!(timestamp_micros(leap), "2024-02-29T23:59:58.500000Z");
        let later = UNIX_EPOCH + Duration::from_secs(4_102_444_800); // 2100-01-01
        assert_eq!(timestamp(later), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn payloads_fall_back_to_raw_text() {
        assert_eq!(payload_pretty(r#"{"n":1}"#), "{\n  \"n\": 1\n}");
        assert_eq!(payload_pretty("not json {"), "not json {");
    }
}
