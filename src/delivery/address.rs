//! Where a webhook may go: the address rules checked when a tenant sets its webhook
//! (`check_url`, and the pattern the OpenAPI document states), and the resolver that refuses
//! private addresses at every delivery, so the connection goes to exactly the addresses
//! checked.

use std::net::{IpAddr, SocketAddr};

/// Whether an address is one a webhook may not reach unless private addresses are allowed:
/// anything but a public unicast address.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || (a == 192 && b == 0 && v4.octets()[2] == 0) // IETF protocol assignments
                || (a == 198 && (18..20).contains(&b)) // benchmarking
                || a >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link-local
                || first == 0x2001 && v6.segments()[1] == 0x0db8 // documentation
                || first == 0x0064 && v6.segments()[1] == 0xff9b // NAT64
        }
    }
}

/// Resolves a webhook's host and refuses it when any of its addresses is private (unless
/// allowed): the connection then goes to exactly the addresses checked, so a name cannot
/// answer one address to the check and another to the connection. The refusal's text, which
/// the tenant reads in its delivery log, names the host and not the address it resolved to
/// (a tenant admin must not learn the server's internal names that way); the address goes
/// to the server's own log.
pub(super) struct CheckedResolver {
    pub(super) allow_private: bool,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() {
                return Err(format!("{host} has no address").into());
            }
            if !allow_private && let Some(a) = addrs.iter().find(|a| is_private(a.ip())) {
                // The delivery log is the tenant's to read: it says that the name was
                // refused, never what an internal name resolves to. The operator's log has
                // the address.
                tracing::info!(host = %host, address = %a.ip(), "webhook: a name resolving to a private address refused");
                return Err(format!(
                    "{host} resolves to a private or reserved address (refused without \
                     --webhook-allow-private)"
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The grammar of a webhook address, as the OpenAPI document states it (`WEBHOOK_URL_PATTERN`)
/// and `check_url` enforces it: `https://` or `http://`, a host name (whose last label starts with a
/// letter) or a dotted IPv4 address, an optional port, then an optional path and query
/// without spaces or a fragment.
pub const WEBHOOK_URL_PATTERN: &str = concat!(
    "^https?://(",
    "([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    "|((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    ")(:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?",
    "([/?][^\\s#]*)?$"
);

/// Whether `label` is a host name label: 1–63 letters, digits and inner hyphens.
fn is_label(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `host` is a dotted IPv4 address written without leading zeros.
fn is_dotted_ipv4(host: &str) -> bool {
    let parts: Vec<&str> = host.split('.').collect();
    parts.len() == 4
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|c| c.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
                && p.parse::<u16>().is_ok_and(|n| n <= 255)
        })
}

/// Checks a webhook address against `WEBHOOK_URL_PATTERN`; the answer is the reason it is
/// refused.
pub fn check_url(text: &str) -> Result<reqwest::Url, String> {
    if text.chars().count() > 2048 {
        return Err("the address is longer than 2048 characters".into());
    }
    let Some(rest) = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
    else {
        return Err("the address must start with https:// or http://".into());
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    let labels: Vec<&str> = host.split('.').collect();
    let named = labels.iter().all(|l| is_label(l))
        && labels
            .last()
            .is_some_and(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()));
    if !named && !is_dotted_ipv4(host) {
        return Err(format!(
            "the host must be a name (letters, digits, inner hyphens; the last label starting \
             with a letter) or a dotted IPv4 address, not {host:?}"
        ));
    }
    if let Some(p) = port
        && !(!p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|c| c.is_ascii_digit())
            && (p.len() < 5 || !p.starts_with('0'))
            && p.parse::<u32>().is_ok_and(|n| n <= 65_535))
    {
        return Err(format!("the port must be a number up to 65535, not {p:?}"));
    }
    if tail
        .chars()
        .any(|c| c.is_whitespace() || c == '\u{feff}' || c == '#')
    {
        return Err("the path and query may hold no spaces and no fragment (#)".into());
    }
    reqwest::Url::parse(text).map_err(|e| format!("not a valid address: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_told_from_public_ones() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn addresses_are_checked_as_given() {
        assert!(check_url("http://hooks.example.com/sluice?x=1").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        assert!(check_url("https://hooks.example.com/sluice").is_ok());
        assert!(check_url("https://127.0.0.1:8443/x").is_ok());
        assert!(check_url("http://a-b.c9?x=y z").is_err());
        for bad in [
            "hooks.example.com/x",
            "ftp://hooks.example.com/",
            "HTTP://hooks.example.com/",
            "HTTPS://hooks.example.com/",
            "https://",
            "https:/hooks.example.com/",
            "http://user:pw@hooks.example.com/",
            "http://hooks.example.com/#frag",
            "http://",
            "http://0000",
            "http://256.1.1.1/",
            "http://01.1.1.1/",
            "http://a:65536/",
            "http://a:00080/",
            "http://-a.example/",
            "http://[::1]/",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}
