//! One authority per terminated request: the tunnel's decided host and port. A request that
//! names anything else — a second `Host`, userinfo, another host, another port, in the Host
//! header or an absolute-form / `:authority` URI — is refused (`host_mismatch`); every request
//! that passes goes upstream with exactly one authority written by the proxy, never the
//! client's. On a shared front end (a CDN, an ingress, virtual hosts), a secret sent under
//! another Host is a secret delivered to another tenant.

use http::header::HOST;
use http::{Request, Uri};

/// The authority the proxy writes: `host`, or `host:port` when the port is not 443.
pub fn decided(host: &str, port: u16) -> String {
    if port == 443 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

/// Whether `value` (a Host value or a URI authority) is exactly `host[:port]` (the port may be
/// omitted when it is 443); no userinfo, no other spelling of the port.
pub fn names_decided(value: &str, host: &str, port: u16) -> bool {
    if value.contains('@') {
        return false;
    }
    match value.rsplit_once(':') {
        Some((h, p)) => {
            h.eq_ignore_ascii_case(host)
                && !p.starts_with('0')
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>() == Ok(port)
        }
        None => port == 443 && value.eq_ignore_ascii_case(host),
    }
}

/// Why `req` does not name exactly the decided authority, if it does not.
pub fn mismatch<B>(req: &Request<B>, host: &str, port: u16) -> Option<String> {
    let want = || decided(host, port);
    let hosts = req.headers().get_all(HOST);
    let mut n = 0;
    for h in hosts.iter() {
        n += 1;
        if n > 1 {
            return Some("the request has more than one Host header".into());
        }
        if !names_decided(&String::from_utf8_lossy(h.as_bytes()), host, port) {
            return Some(format!(
                "the Host header is not {}, the authority the tunnel was decided for",
                want()
            ));
        }
    }
    if let Some(a) = req.uri().authority() {
        if !names_decided(a.as_str(), host, port) {
            return Some(format!(
                "the request's authority is not {}, the authority the tunnel was decided for",
                want()
            ));
        }
    }
    None
}

/// The authority the proxy writes for one tunnel, built once.
#[derive(Debug, Clone)]
pub struct Written {
    authority: http::uri::Authority,
    host: http::HeaderValue,
}

impl Written {
    pub fn new(host: &str, port: u16) -> Option<Self> {
        let text = decided(host, port);
        Some(Written {
            authority: text.parse().ok()?,
            host: http::HeaderValue::from_str(&text).ok()?,
        })
    }

    /// Write the one authority on `req`: every client Host removed; HTTP/1.1 gets an
    /// origin-form target and one Host, HTTP/2 an absolute URI (`:authority`) and no Host.
    pub fn write<B>(&self, req: &mut Request<B>, h2: bool) {
        req.headers_mut().remove(HOST);
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        );
        if h2 {
            parts.scheme = Some(http::uri::Scheme::HTTPS);
            parts.authority = Some(self.authority.clone());
        } else {
            req.headers_mut().insert(HOST, self.host.clone());
        }
        if let Ok(u) = Uri::from_parts(parts) {
            *req.uri_mut() = u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::get(uri);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn only_the_decided_authority_passes() {
        assert!(mismatch(&req("/v1", &["api.test:8443"]), "api.test", 8443).is_none());
        assert!(mismatch(&req("/v1", &["API.test:8443"]), "api.test", 8443).is_none());
        assert!(mismatch(&req("/v1", &["api.test"]), "api.test", 443).is_none());
        assert!(mismatch(&req("/v1", &[]), "api.test", 8443).is_none());
        assert!(mismatch(&req("https://api.test:8443/v1", &[]), "api.test", 8443).is_none());
        for (uri, hosts) in [
            ("/v1", vec!["api.test:8443", "evil.test"]),
            ("/v1", vec!["api.test:8443", "api.test:8443"]),
            ("/v1", vec!["evil.test"]),
            ("/v1", vec!["api.test:443@evil.test"]),
            ("/v1", vec!["api.test:9999"]),
            ("/v1", vec!["api.test:08443"]),
            ("/v1", vec!["api.test"]),
            ("/v1", vec!["api.test.:8443"]),
            ("https://api.test:8443/v1", vec!["evil.test"]),
            ("https://evil.test/v1", vec!["api.test:8443"]),
            ("https://api.test:8443@evil.test/v1", vec![]),
        ] {
            assert!(
                mismatch(&req(uri, &hosts), "api.test", 8443).is_some(),
                "{uri} {hosts:?}"
            );
        }
    }

    #[test]
    fn the_proxy_writes_one_authority() {
        let mut r = req("https://api.test:8443/v1?q=1", &["api.test:8443"]);
        Written::new("api.test", 8443).unwrap().write(&mut r, false);
        assert_eq!(r.uri(), "/v1?q=1");
        assert_eq!(r.headers().get_all(HOST).iter().count(), 1);
        assert_eq!(r.headers()[HOST], "api.test:8443");
        let mut r = req("/v1", &["api.test"]);
        Written::new("api.test", 443).unwrap().write(&mut r, true);
        assert_eq!(r.uri(), "https://api.test/v1");
        assert!(r.headers().get(HOST).is_none());
    }
}
