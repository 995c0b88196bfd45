//! Signing webhooks the way the Standard Webhooks specification does: the secret's format,
//! the HMAC-SHA256 signature over `id.timestamp.body`, the event id and the event body. Built
//! from the outbox entry alone, so every delivery of one event carries the same bytes and a
//! receiver can drop a duplicate by its id.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

use crate::domain::TenantId;
use crate::store::OutboxEntry;

/// The prefix of a signing secret (then the base64 of the key), as Standard Webhooks has it.
pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh signing secret: `whsec_` and the base64 of 24 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 24];
    getrandom::fill(&mut key).expect("the OS random source works");
    format!("{SECRET_PREFIX}{}", BASE64.encode(key))
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The `webhook-signature` header of a message: `v1,` and the base64 of the HMAC-SHA256, keyed
/// with the secret's decoded bytes, of `<webhook-id>.<webhook-timestamp>.<body>`.
pub fn signature(secret: &str, webhook_id: &str, timestamp: u64, body: &[u8]) -> Option<String> {
    let key = BASE64
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .ok()?;
    let mac = hmac_sha256(
        &key,
        &[
            webhook_id.as_bytes(),
            b".",
            timestamp.to_string().as_bytes(),
            b".",
            body,
        ],
    );
    Some(format!("v1,{}", BASE64.encode(mac)))
}

/// The `webhook-id` of an event: the same for every delivery of it (a receiver drops
/// duplicates by it), different for each change of each execution.
pub fn webhook_id(execution_id: &str, seq: u64) -> String {
    format!("msg_{execution_id}_{seq}")
}

/// The JSON body of an event: `type`, `timestamp` (of the change) and `data`. Built from the
/// outbox entry alone, so every delivery of one event has the same bytes.
pub fn payload(tenant: &TenantId, e: &OutboxEntry) -> Vec<u8> {
    let field = |name: &str| e.fields.get(name).map(String::as_str).unwrap_or_default();
    let mut data = serde_json::json!({
        "execution_id": e.execution_id,
        "tenant_id": tenant.as_str(),
        "flow_id": field("flow"),
        "status": e.kind,
        "attempt": field("attempt").parse::<u64>().unwrap_or(0),
        "sequence": e.seq,
    });
    if e.kind == "failed" {
        data["error"] = serde_json::json!({"kind": field("err_kind"), "message": field("err_msg")});
        data["dead_lettered"] = serde_json::json!(field("dead") == "1");
    }
    if e.kind == "deleted" {
        data["previous_status"] = serde_json::json!(field("was"));
    }
    let timestamp =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(e.at_ms) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default();
    serde_json::to_vec(&serde_json::json!({
        "type": format!("execution.{}", e.kind),
        "timestamp": timestamp,
        "data": data,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (its reference libraries' tests).
    #[test]
    fn signatures_match_the_specifications_example() {
        let sig = signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            sig.as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn secrets_are_fresh_and_decode_to_24_bytes() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        let key = BASE64
            .decode(a.strip_prefix(SECRET_PREFIX).unwrap())
            .unwrap();
        assert_eq!(key.len(), 24);
    }
}
