//! Sign-in: the admin token, and the session cookie that stands for it.
//!
//! A session cookie is `{expiry}.{id}.{mac}`: the Unix second it expires, a random session id,
//! and an HMAC-SHA256 of both and of the admin token under the session key: the application's
//! ([`AdminBuilder::session_key`](crate::AdminBuilder::session_key), shared by its replicas) or
//! one drawn at start-up (sessions then end with the process). A session is bound to the token
//! it was opened with: changing the token ends every session, whatever the session key (after
//! a token leaks, changing it is enough). A cookie is valid while its MAC
//! checks, its time has not come and its id was not signed out: a sign-out records the id in
//! the database until the cookie would have expired, so a copied cookie is refused by every
//! replica. The token is compared through a MAC too, so the comparison takes the same time
//! whatever the guess.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::http::Request;
use crate::AdminError;

pub(crate) const COOKIE: &str = "outbox_admin";

/// The shortest session key the pages accept, in bytes: HMAC-SHA256's block of entropy.
pub const MIN_SESSION_KEY_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

pub(crate) struct Sessions {
    key: Vec<u8>,
    token_mac: Vec<u8>,
    cookie_path: String,
    secure: bool,
    lifetime: Duration,
}

/// A signed-in session, as its cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    pub id: String,
    pub expires: SystemTime,
}

fn random_bytes<const N: usize>() -> Result<[u8; N], AdminError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| AdminError::Random(e.to_string()))?;
    Ok(bytes)
}

impl Sessions {
    /// Sessions signed with `key`, or with a key drawn now when there is none.
    pub fn new(
        token: &str,
        key: Option<&[u8]>,
        cookie_path: String,
        secure: bool,
        lifetime: Duration,
    ) -> Result<Self, AdminError> {
        let key = match key {
            Some(key) if key.len() < MIN_SESSION_KEY_BYTES => {
                return Err(AdminError::SessionKeyTooShort { length: key.len() })
            }
            Some(key) => key.to_vec(),
            None => random_bytes::<32>()?.to_vec(),
        };
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
        // HMAC takes a key of any length; `new_from_slice` fails only on lengths the hash
        // cannot take.
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

    /// The MAC of a session's `signed` part: under the session key, over the admin token (by
    /// its own MAC) and the part, so that a new token ends the sessions of the old one.
    fn session_mac(&self, signed: &str) -> HmacSha256 {
        let mut mac = self.hmac(b"session:", &self.token_mac);
        mac.update(b".");
        mac.update(signed.as_bytes());
        mac
    }

    fn session_value(&self, id: &str, expires: u64) -> String {
        let signed = format!("{expires}.{id}");
        let mac = self.session_mac(&signed).finalize().into_bytes();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    /// The session `value` stands for, if this key signed it and it has not expired (whether
    /// it signed out is the database's to say).
    fn valid(&self, value: &str) -> Option<Session> {
        let (signed, mac) = value.rsplit_once('.')?;
        let (expires, id) = signed.split_once('.')?;
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        self.session_mac(signed).verify_slice(&mac).ok()?;
        let expires = expires.parse::<u64>().ok().filter(|at| *at > Self::now())?;
        Some(Session {
            id: id.to_owned(),
            expires: UNIX_EPOCH + Duration::from_secs(expires),
        })
    }

    /// The session the request's cookie stands for, if it is authentic and unexpired.
    pub fn session(&self, request: &Request) -> Option<Session> {
        request.cookie(COOKIE).and_then(|value| self.valid(value))
    }

    fn cookie(&self, value: &str, max_age: u64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{COOKIE}={value}; Path={}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            self.cookie_path
        )
    }

    /// The `Set-Cookie` value of a new session.
    pub fn issue(&self) -> Result<String, AdminError> {
        let id = URL_SAFE_NO_PAD.encode(random_bytes::<16>()?);
        let lifetime = self.lifetime.as_secs().max(1);
        let value = self.session_value(&id, Self::now().saturating_add(lifetime));
        Ok(self.cookie(&value, lifetime))
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
            None,
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
        let set = s.issue().unwrap();
        assert!(set.contains("; HttpOnly"), "{set}");
        assert!(set.contains("; SameSite=Strict"), "{set}");
        assert!(set.contains("; Path=/outbox;"), "{set}");
        assert!(!set.contains("Secure"), "{set}");
        assert!(s.session(&with_cookie(&set)).is_some());
    }

    #[test]
    fn forged_expired_and_foreign_cookies_are_refused() {
        let s = sessions();
        let set = s.issue().unwrap();
        let value = set
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("outbox_admin=");
        let (expires, rest) = value.split_once('.').unwrap();
        let (id, mac) = rest.split_once('.').unwrap();
        assert_eq!(s.valid(value).unwrap().id, id);
        // A later expiry, or another id, with the old MAC.
        let later: u64 = expires.parse::<u64>().unwrap() + 3600;
        assert!(s.valid(&format!("{later}.{id}.{mac}")).is_none());
        assert!(s.valid(&format!("{expires}.another-id.{mac}")).is_none());
        // A correctly signed but expired one.
        assert!(s.valid(&s.session_value(id, Sessions::now() - 1)).is_none());
        // One from another process (another key).
        assert!(sessions().valid(value).is_none());
        for nonsense in [
            "",
            ".",
            "..",
            "abc",
            "1.",
            ".abc",
            "1.a.",
            "99999999999.!!!",
            "9.x.!!!",
        ] {
            assert!(s.valid(nonsense).is_none(), "{nonsense}");
        }
    }

    /// After a token leaks, an operator changes it and keeps the session key its replicas
    /// share: a cookie signed in with the old token must stop working at once.
    #[test]
    fn a_new_token_ends_the_sessions_of_the_old_one() {
        let key = [7u8; MIN_SESSION_KEY_BYTES];
        let with_token = |token: &str| {
            Sessions::new(
                token,
                Some(&key),
                "/outbox".to_owned(),
                false,
                Duration::from_secs(60),
            )
            .unwrap()
        };
        let leaked = with_token("leaked-token-1");
        let cookie = with_cookie(&leaked.issue().unwrap());
        assert!(leaked.session(&cookie).is_some());
        assert!(
            with_token("leaked-token-1").session(&cookie).is_some(),
            "a replica with the same key and token takes it"
        );
        assert!(
            with_token("rotated-token-2").session(&cookie).is_none(),
            "a session of the old token outlived its rotation"
        );
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
        let s = Sessions::new(
            "correct-horse-battery",
            None,
            "/".into(),
            true,
            Duration::ZERO,
        )
        .unwrap();
        assert!(s.issue().unwrap().ends_with("; Secure"));
        assert!(s.issue().unwrap().contains("Max-Age=1;"));
        assert!(s.clear().starts_with("outbox_admin=; Path=/; Max-Age=0;"));
    }

    #[test]
    fn replicas_with_one_configured_key_accept_each_others_cookies() {
        let key = [7u8; 48];
        let replica = |key: Option<&[u8]>| {
            Sessions::new(
                "correct-horse-battery",
                key,
                "/".into(),
                false,
                Duration::from_secs(60),
            )
            .unwrap()
        };
        let (a, b) = (replica(Some(&key)), replica(Some(&key)));
        let set = a.issue().unwrap();
        assert_eq!(
            a.session(&with_cookie(&set)),
            b.session(&with_cookie(&set)),
            "one session on both"
        );
        assert!(b.session(&with_cookie(&set)).is_some());
        assert!(replica(None).session(&with_cookie(&set)).is_none());
        // Two sign-ins are two sessions: one can sign out alone.
        assert_ne!(
            a.session(&with_cookie(&a.issue().unwrap())).unwrap().id,
            a.session(&with_cookie(&set)).unwrap().id
        );
        let short = Sessions::new(
            "correct-horse-battery",
            Some(&[1; 31]),
            "/".into(),
            false,
            Duration::ZERO,
        );
        assert!(matches!(
            short,
            Err(AdminError::SessionKeyTooShort { length: 31 })
        ));
    }
}
