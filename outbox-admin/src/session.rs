//! Sign-in: the admin token, and the session cookie that stands for it.
//!
//! A session cookie is `{expiry}.{mac}`: the Unix second it expires and an HMAC-SHA256 of it
//! under a key drawn at start-up. Nothing is stored: a cookie is valid while its MAC checks and
//! its time has not come, and every session ends with the process (a new key). The token is
//! compared the same way, through a MAC, so the comparison takes the same time whatever the
//! guess.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::http::Request;
use crate::AdminError;

pub(crate) const COOKIE: &str = "outbox_admin";

type HmacSha256 = Hmac<Sha256>;

pub(crate) struct Sessions {
    key: [u8; 32],
    token_mac: Vec<u8>,
    cookie_path: String,
    secure: bool,
    lifetime: Duration,
}

impl Sessions {
    pub fn new(
        token: &str,
        cookie_path: String,
        secure: bool,
        lifetime: Duration,
    ) -> Result<Self, AdminError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| AdminError::Random(e.to_string()))?;
        let mut sessions = Sessions {
            key,
            token_mac: Vec::new(),
            cookie_path,
            secure,
            lifetime,
        };
        sessions.token_mac = sessions.mac(b"token:", token.as_bytes());
        Ok(sessions)
    }

    fn hmac(&self, domain: &[u8], data: &[u8]) -> HmacSha256 {
        // A 32-byte key is always accepted by HMAC; `new_from_slice` fails only on lengths
        // the hash cannot take.
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(domain);
        mac.update(data);
        mac
    }

    fn mac(&self, domain: &[u8], data: &[u8]) -> Vec<u8> {
        self.hmac(domain, data).finalize().into_bytes().to_vec()
    }

    /// Whether `given` is the admin token, in constant time.
    pub fn is_token(&self, given: &str) -> bool {
        self.hmac(b"token:", given.trim().as_bytes())
            .verify_slice(&self.token_mac)
            .is_ok()
    }

    /// Whether the request carries the token as `Authorization: Bearer`.
    pub fn bearer(&self, request: &Request) -> bool {
        request
            .header_value("authorization")
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|token| self.is_token(token))
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn session_value(&self, expires: u64) -> String {
        let expires = expires.to_string();
        let mac = self.mac(b"session:", expires.as_bytes());
        format!("{expires}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    /// Whether `value` is a session cookie this process issued that has not expired.
    fn valid(&self, value: &str) -> bool {
        let Some((expires, mac)) = value.split_once('.') else {
            return false;
        };
        let Ok(mac) = URL_SAFE_NO_PAD.decode(mac) else {
            return false;
        };
        let authentic = self
            .hmac(b"session:", expires.as_bytes())
            .verify_slice(&mac)
            .is_ok();
        authentic && expires.parse::<u64>().is_ok_and(|at| at > Self::now())
    }

    pub fn signed_in(&self, request: &Request) -> bool {
        request
            .cookie(COOKIE)
            .is_some_and(|value| self.valid(value))
    }

    fn cookie(&self, value: &str, max_age: u64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{COOKIE}={value}; Path={}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            self.cookie_path
        )
    }

    /// The `Set-Cookie` value of a new session.
    pub fn issue(&self) -> String {
        let lifetime = self.lifetime.as_secs().max(1);
        let value = self.session_value(Self::now().saturating_add(lifetime));
        self.cookie(&value, lifetime)
    }

    /// The `Set-Cookie` value that ends the session in this browser.
    pub fn clear(&self) -> String {
        self.cookie("", 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Sessions {
        Sessions::new(
            "correct-horse-battery",
            "/outbox".to_owned(),
            false,
            Duration::from_secs(60),
        )
        .unwrap()
    }

    fn with_cookie(set_cookie: &str) -> Request {
        let pair = set_cookie.split(';').next().unwrap();
        Request::new("GET", "/").header("cookie", pair)
    }

    #[test]
    fn only_the_token_signs_in() {
        let s = sessions();
        assert!(s.is_token("correct-horse-battery"));
        assert!(s.is_token(" correct-horse-battery\n"));
        assert!(!s.is_token("correct-horse-batter"));
        assert!(!s.is_token(""));
    }

    #[test]
    fn an_issued_cookie_is_http_only_strict_and_valid() {
        let s = sessions();
        let set = s.issue();
        assert!(set.contains("; HttpOnly"), "{set}");
        assert!(set.contains("; SameSite=Strict"), "{set}");
        assert!(set.contains("; Path=/outbox;"), "{set}");
        assert!(!set.contains("Secure"), "{set}");
        assert!(s.signed_in(&with_cookie(&set)));
    }

    #[test]
    fn forged_expired_and_foreign_cookies_are_refused() {
        let s = sessions();
        let set = s.issue();
        let value = set
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("outbox_admin=");
        let (expires, mac) = value.split_once('.').unwrap();
        // A later expiry with the old MAC.
        let later: u64 = expires.parse::<u64>().unwrap() + 3600;
        assert!(!s.valid(&format!("{later}.{mac}")));
        // A correctly signed but expired one.
        assert!(!s.valid(&s.session_value(Sessions::now() - 1)));
        // One from another process (another key).
        assert!(!sessions().valid(value));
        for nonsense in ["", ".", "abc", "1.", ".abc", "99999999999.!!!"] {
            assert!(!s.valid(nonsense), "{nonsense}");
        }
    }

    #[test]
    fn the_bearer_token_is_checked_too() {
        let s = sessions();
        let ok = Request::new("GET", "/").header("Authorization", "Bearer correct-horse-battery");
        let bad = Request::new("GET", "/").header("Authorization", "Bearer wrong");
        let basic = Request::new("GET", "/").header("Authorization", "Basic correct-horse-battery");
        assert!(s.bearer(&ok));
        assert!(!s.bearer(&bad) && !s.bearer(&basic));
    }

    #[test]
    fn a_secure_cookie_says_so_and_clearing_expires_it() {
        let s = Sessions::new("correct-horse-battery", "/".into(), true, Duration::ZERO).unwrap();
        assert!(s.issue().ends_with("; Secure"));
        assert!(s.issue().contains("Max-Age=1;"));
        assert!(s.clear().starts_with("outbox_admin=; Path=/; Max-Age=0;"));
    }
}
