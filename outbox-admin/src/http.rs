//! The framework-neutral request and response, and what the pages read from a request.

use std::collections::HashMap;

/// A request as [`Admin::handle`](crate::Admin::handle) takes it: the method, the path below
/// the mount point with its query, the headers, and the body.
#[derive(Debug, Clone, Default)]
pub struct Request {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    peer: Option<String>,
}

impl Request {
    /// A request for `path_and_query` below the mount point (`/dead?type=a`).
    pub fn new(method: &str, path_and_query: &str) -> Self {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        Request {
            method: method.to_ascii_uppercase(),
            path: path.to_owned(),
            query: query.to_owned(),
            ..Request::default()
        }
    }

    /// A request header (names are matched without regard to case).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The body: for a `POST`, the `application/x-www-form-urlencoded` form.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Who sent it (an address), for the log of actions.
    pub fn peer(mut self, peer: impl std::fmt::Display) -> Self {
        self.peer = Some(peer.to_string());
        self
    }

    pub(crate) fn method(&self) -> &str {
        &self.method
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn peer_or_unknown(&self) -> &str {
        self.peer.as_deref().unwrap_or("an unknown address")
    }

    pub(crate) fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The query's parameters; for a repeated one, the last.
    pub(crate) fn query(&self) -> Params {
        Params::parse(self.query.as_bytes())
    }

    /// The form in the body.
    pub(crate) fn form(&self) -> Params {
        Params::parse(&self.body)
    }

    /// The value of cookie `name`, from every `Cookie` header.
    pub(crate) fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
            .flat_map(|(_, v)| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.trim_matches('"'))
    }

    /// Whether a browser sent this on behalf of another site: `Sec-Fetch-Site` says so, or
    /// (older browsers) `Origin` names another host than `Host`. Requests without either
    /// (scripts, `curl`) are not cross-site: they carry no one else's cookie. The pages refuse
    /// such `POST`s; an application can apply the same rule to its own forms.
    pub fn is_cross_site(&self) -> bool {
        match self.header_value("sec-fetch-site") {
            Some(site) => site != "same-origin" && site != "none",
            None => match (self.header_value("origin"), self.header_value("host")) {
                (Some(origin), Some(host)) => {
                    origin.split_once("://").map(|(_, rest)| rest) != Some(host)
                }
                (Some(_), None) => true,
                _ => false,
            },
        }
    }
}

/// Decoded query or form parameters.
#[derive(Debug, Default)]
pub(crate) struct Params(HashMap<String, String>);

impl Params {
    fn parse(bytes: &[u8]) -> Self {
        Params(form_urlencoded::parse(bytes).into_owned().collect())
    }

    /// A parameter, trimmed; `None` when missing or empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
    }
}

/// What to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The headers to send, `Content-Type` and `Set-Cookie` included.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What every page's response says about itself: nothing inline may run, nothing may frame
/// it, nothing is cached.
const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
];

impl Response {
    fn with_body(status: u16, content_type: &str, body: Vec<u8>) -> Self {
        let mut headers = vec![("content-type".to_owned(), content_type.to_owned())];
        headers.extend(
            SECURITY_HEADERS
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned())),
        );
        Response {
            status,
            headers,
            body,
        }
    }

    pub(crate) fn html(status: u16, html: String) -> Self {
        Response::with_body(status, "text/html; charset=utf-8", html.into_bytes())
    }

    pub(crate) fn json(status: u16, value: &serde_json::Value) -> Self {
        Response::with_body(
            status,
            "application/json",
            serde_json::to_vec_pretty(value).unwrap_or_default(),
        )
    }

    /// A `303 See Other` to `location` (an absolute path of this site).
    pub(crate) fn redirect(location: &str) -> Self {
        let mut response = Response::with_body(303, "text/plain; charset=utf-8", Vec::new());
        response
            .headers
            .push(("location".to_owned(), location.to_owned()));
        response
    }

    pub(crate) fn set_cookie(mut self, cookie: String) -> Self {
        self.headers.push(("set-cookie".to_owned(), cookie));
        self
    }

    /// The first header `name` (without regard to case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy), for tests and logs.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_split_from_the_path_and_decoded() {
        let request = Request::new("get", "/dead?type=comment.thankYou&key=a%20b+c&empty=");
        assert_eq!(request.method(), "GET");
        assert_eq!(request.path(), "/dead");
        let query = request.query();
        assert_eq!(query.get("type"), Some("comment.thankYou"));
        assert_eq!(query.get("key"), Some("a b c"));
        assert_eq!(query.get("empty"), None);
        assert_eq!(query.get("missing"), None);
    }

    #[test]
    fn cookies_are_found_across_headers() {
        let request = Request::new("GET", "/")
            .header("Cookie", "a=1; outbox_admin=xyz")
            .header("cookie", "b=2");
        assert_eq!(request.cookie("outbox_admin"), Some("xyz"));
        assert_eq!(request.cookie("b"), Some("2"));
        assert_eq!(request.cookie("outbox"), None);
    }

    #[test]
    fn cross_site_requests_are_recognised() {
        let same = Request::new("POST", "/").header("Sec-Fetch-Site", "same-origin");
        let typed = Request::new("POST", "/").header("Sec-Fetch-Site", "none");
        let other = Request::new("POST", "/").header("Sec-Fetch-Site", "cross-site");
        let sibling = Request::new("POST", "/").header("Sec-Fetch-Site", "same-site");
        assert!(!same.is_cross_site() && !typed.is_cross_site());
        assert!(other.is_cross_site() && sibling.is_cross_site());

        let origin_ok = Request::new("POST", "/")
            .header("Origin", "http://127.0.0.1:8000")
            .header("Host", "127.0.0.1:8000");
        let origin_bad = Request::new("POST", "/")
            .header("Origin", "http://evil.example")
            .header("Host", "127.0.0.1:8000");
        let null_origin = Request::new("POST", "/")
            .header("Origin", "null")
            .header("Host", "127.0.0.1:8000");
        assert!(!origin_ok.is_cross_site());
        assert!(origin_bad.is_cross_site() && null_origin.is_cross_site());
        assert!(!Request::new("POST", "/").is_cross_site());
    }
}
