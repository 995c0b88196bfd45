//! What keeps a `--dev-auth` server from being driven by a web page. Dev auth checks no
//! credentials, so listening on loopback is not enough: a page whose DNS name is rebound to
//! 127.0.0.1 reaches the port with its own name in `Host`, and any page can send a "simple"
//! cross-site `POST` (no preflight) to it. Under dev auth every request must therefore name a
//! loopback host (`localhost`, `127.0.0.0/8`, `[::1]`, any port, any case, one trailing dot)
//! and come from no browser origin or the server's own (or one `--cors-origin` allows); the
//! rest get a 403 problem document (`dev_auth_host_refused`, `dev_auth_origin_refused`).
//!
//! With `--dangerously-allow-dev-auth-on-network` the host is not checked (the operator chose
//! to serve other names); the origin still is. Servers that authenticate need none of this:
//! a rebound page or a cross-site form holds no credential.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::{HeaderMap, HeaderValue, Uri, header};

use super::error::ApiError;

/// The checks a dev-auth server applies to every request.
#[derive(Debug, Clone)]
pub struct DevAuthGuard {
    /// Whether `Host` must name a loopback host (off with
    /// `--dangerously-allow-dev-auth-on-network`).
    pub loopback_host_only: bool,
    /// Origins `--cors-origin` allows besides the server's own.
    pub allowed_origins: Vec<HeaderValue>,
}

impl DevAuthGuard {
    /// Refuses a request a web page on another site could have sent or read.
    pub fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        // HTTP/2 carries the host in the request's authority, HTTP/1 in `Host`.
        let host = uri.authority().map(|a| a.as_str().to_owned()).or_else(|| {
            headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
        let Some((name, port)) = host.as_deref().and_then(split_host) else {
            return Err(host_refused());
        };
        if self.loopback_host_only && !is_loopback_name(&name) {
            return Err(host_refused());
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            // Not a browser's cross-origin request, but a page may still have sent it without
            // an Origin (a cross-site `<img>`): browsers say so in Sec-Fetch-Site.
            return match headers.get("sec-fetch-site").map(HeaderValue::as_bytes) {
                None | Some(b"same-origin" | b"none") => Ok(()),
                Some(_) => Err(origin_refused()),
            };
        };
        if self.allowed_origins.iter().any(|o| o == origin) {
            return Ok(());
        }
        let same = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://"))
            .and_then(split_host)
            .is_some_and(|(n, p)| n == name && p.unwrap_or(80) == port.unwrap_or(80));
        if same { Ok(()) } else { Err(origin_refused()) }
    }
}

/// `host[:port]` split into a normalised name (lower case, no trailing dot, IPv6 without
/// brackets) and its port; `None` when it is not of that shape.
fn split_host(s: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (v6, port)
    } else {
        match s.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name).to_owned();
    if name.is_empty() {
        return None;
    }
    Some((name, port))
}

/// `localhost`, an address of 127.0.0.0/8, or `::1` (also as an IPv4-mapped address).
fn is_loopback_name(name: &str) -> bool {
    if name == "localhost" {
        return true;
    }
    if let Ok(v4) = name.parse::<Ipv4Addr>() {
        return v4.is_loopback();
    }
    if let Ok(v6) = name.parse::<Ipv6Addr>() {
        return v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback());
    }
    false
}

fn host_refused() -> ApiError {
    ApiError::Forbidden {
        code: "dev_auth_host_refused",
        detail: "this server runs with --dev-auth and answers only requests addressed to a \
                 loopback host (localhost, 127.0.0.1, [::1])"
            .into(),
    }
}

fn origin_refused() -> ApiError {
    ApiError::Forbidden {
        code: "dev_auth_origin_refused",
        detail: "this server runs with --dev-auth and answers no request from another web \
                 origin (allow one with --cors-origin)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(guard: &DevAuthGuard, host: &str, origin: Option<&str>) -> Result<(), &'static str> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            headers.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        guard
            .check(&Uri::from_static("/api/tenants"), &headers)
            .map_err(|e| e.code())
    }

    fn guard() -> DevAuthGuard {
        DevAuthGuard {
            loopback_host_only: true,
            allowed_origins: vec![HeaderValue::from_static("http://console.test:3000")],
        }
    }

    #[test]
    fn loopback_hosts_are_served_in_every_spelling() {
        let g = guard();
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:8080",
            "localhost.:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:9",
            "[::1]:8080",
            "[::1]",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert_eq!(check(&g, host, None), Ok(()), "{host}");
        }
    }

    #[test]
    fn other_hosts_are_refused() {
        let g = guard();
        for host in [
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io:8080",
            "10.0.0.1:8080",
            "[::2]:8080",
            "0.0.0.0:8080",
            "localhost:notaport",
            "",
        ] {
            assert_eq!(
                check(&g, host, None),
                Err("dev_auth_host_refused"),
                "{host}"
            );
        }
        let open = DevAuthGuard {
            loopback_host_only: false,
            ..guard()
        };
        assert_eq!(check(&open, "10.0.0.1:8080", None), Ok(()));
    }

    #[test]
    fn an_http2_authority_counts_over_the_host_header() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        let g = guard();
        let foreign = Uri::from_static("http://rebound.example:8080/api/tenants");
        assert_eq!(
            g.check(&foreign, &headers).map_err(|e| e.code()),
            Err("dev_auth_host_refused")
        );
        let own = Uri::from_static("http://[::1]:8080/api/tenants");
        assert_eq!(
            g.check(&own, &HeaderMap::new()).map_err(|e| e.code()),
            Ok(())
        );
    }

    #[test]
    fn only_the_servers_own_or_an_allowed_origin_is_served() {
        let g = guard();
        let ok = [
            ("localhost:8080", "http://localhost:8080"),
            ("LocalHost:8080", "http://localhost:8080"),
            ("127.0.0.1", "http://127.0.0.1"),
            ("127.0.0.1:80", "http://127.0.0.1"),
            ("[::1]:8080", "http://[::1]:8080"),
            ("127.0.0.1:8080", "http://console.test:3000"),
        ];
        for (host, origin) in ok {
            assert_eq!(check(&g, host, Some(origin)), Ok(()), "{host} {origin}");
        }
        let refused = [
            ("127.0.0.1:8080", "http://evil.example"),
            ("127.0.0.1:8080", "http://127.0.0.1:8081"),
            ("127.0.0.1:8080", "http://localhost:8080"),
            ("127.0.0.1:8080", "https://127.0.0.1:8080"),
            ("127.0.0.1:8080", "null"),
        ];
        for (host, origin) in refused {
            assert_eq!(
                check(&g, host, Some(origin)),
                Err("dev_auth_origin_refused"),
                "{host} {origin}"
            );
        }
    }
}
