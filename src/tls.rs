//! TLS for sluice's outgoing HTTP: webhook deliveries, the worker's `http` flow handler and the
//! OTLP exporter. rustls with the `ring` provider, verifying certificates against the Mozilla
//! root program's CAs, built in (webpki-roots), plus any a deployment adds for its webhooks
//! (`--webhook-ca-file`, a closed network's private CA).
//!
//! Built in rather than read from the system, so that nothing depends on an OS package being
//! installed: reqwest's own default (rustls-platform-verifier) refuses to build a client at
//! all on a machine without `ca-certificates`, which stopped `serve` before it listened. Every
//! client sluice builds therefore takes its TLS settings from here ([`client_builder`],
//! [`blocking_client_builder`]).
//!
//! reqwest is built without a crypto provider of its own (`rustls-no-provider`): its default,
//! aws-lc-rs, needs more than a C compiler to build, and `ring` needs only that. A reqwest
//! client built the default way (`reqwest::Client::new()`) would panic for want of one; the
//! builders here hand reqwest a finished rustls configuration instead.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The certificates of a PEM file (one or more), to trust besides the built-in roots.
pub fn read_roots(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem =
        std::fs::read(path).with_context(|| format!("cannot read CA file {}", path.display()))?;
    let roots = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("CA file {} is not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !roots.is_empty(),
        "CA file {} holds no certificate",
        path.display()
    );
    // Refused here, at start, rather than at the first delivery.
    client_config(&roots).with_context(|| format!("CA file {}", path.display()))?;
    Ok(roots)
}

/// The TLS settings of every outgoing connection: TLS 1.2 or 1.3, HTTP/1.1, certificates
/// verified against the built-in roots and `extra`.
fn client_config(extra: &[CertificateDer<'static>]) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots =
        rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert.clone())
            .context("a certificate that cannot be a root")?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A reqwest client builder with sluice's TLS settings (see the module docs).
pub fn client_builder(extra: &[CertificateDer<'static>]) -> anyhow::Result<reqwest::ClientBuilder> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(client_config(extra)?))
}

/// The same for a blocking client (the OTLP exporter's).
pub fn blocking_client_builder() -> anyhow::Result<reqwest::blocking::ClientBuilder> {
    Ok(reqwest::blocking::Client::builder().tls_backend_preconfigured(client_config(&[])?))
}
