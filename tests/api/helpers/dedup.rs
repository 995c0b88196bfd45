//! What the dedup mappings on Redis should look like, checked from the keys alone (the tests
//! of `dedup.rs` and the fault suite's end state): a live execution's mapping is a field of
//! its tenant's bucket, an ended one's a string key with a TTL, and nothing else.

use redis::aio::ConnectionLike;
use sluice::domain::row;
use sluice::store::keys::{self, KeyKind};

/// Every way the mappings among `keys` (all the keys Redis holds) break that rule, one line
/// each: a bucket field whose execution is not live (ended, gone, force-deleted, another
/// tenant's or another digest's), a string mapping without a TTL (the live form is the
/// bucket's) or of an execution still live, a live execution with a dedup key its bucket does
/// not map to. Empty when all is well.
pub async fn dedup_orphans<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut found = Vec::new();
    let keys: Vec<String> = keys.into_iter().collect();
    // (status, tenant, ddh, deleted) of a row.
    async fn row<C: ConnectionLike + Send>(
        conn: &mut C,
        prefix: &str,
        id: &[u8],
    ) -> (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        let mut key = format!("{prefix}exec:").into_bytes();
        key.extend_from_slice(id);
        let (status, tenant, ddh, deleted): (
            Option<String>,
            Option<String>,
            Option<Vec<u8>>,
            Option<String>,
        ) = redis::cmd("HMGET")
            .arg(key)
            .arg(&[row::STATUS, row::TENANT, row::DEDUP_DIGEST, row::DELETED])
            .query_async(conn)
            .await
            .expect("HMGET row");
        // The digest as hex: layout 5's row holds its 16 bytes (`Shard::stored_digest`).
        let ddh = ddh.map(|d| match d.len() {
            16 => d.iter().map(|b| format!("{b:02x}")).collect(),
            _ => String::from_utf8(d).expect("a hex digest"),
        });
        (status, tenant, ddh, deleted)
    }
    let live = |s: &Option<String>| matches!(s.as_deref(), Some("queued" | "running"));
    for key in &keys {
        let Some(name) = keys::parse(key) else {
            continue;
        };
        let (Some(shard), Some(tenant)) = (name.shard, name.tenant) else {
            continue;
        };
        let prefix = shard.prefix();
        match name.kind {
            KeyKind::DedupBucket => {
                let head = key.rsplit(':').next().unwrap_or_default().to_owned();
                let fields: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
                    .arg(key)
                    .query_async(conn)
                    .await
                    .expect("HGETALL bucket");
                for (field, mapped) in fields {
                    let stored = mapped_id(&mapped);
                    let (status, t, ddh, deleted) = row(conn, &prefix, stored).await;
                    let id = super::id_text(stored);
                    let digest = format!("{head}{field}");
                    if !live(&status)
                        || deleted.is_some()
                        || t.as_deref() != Some(tenant)
                        || ddh.as_deref() != Some(digest.as_str())
                    {
                        found.push(format!(
                            "{key} field {field} maps to {id}, which is {status:?} \
                             (deleted {deleted:?}, tenant {t:?}, digest {ddh:?})"
                        ));
                    }
                }
            }
            KeyKind::Dedup => {
                let (mapped, ttl): (Option<Vec<u8>>, i64) = redis::pipe()
                    .get(key)
                    .ttl(key)
                    .query_async(conn)
                    .await
                    .expect("GET, TTL mapping");
                let Some(mapped) = mapped else { continue };
                let stored = mapped_id(&mapped);
                let (status, ..) = row(conn, &prefix, stored).await;
                let id = super::id_text(stored);
                if ttl < 0 || live(&status) {
                    found.push(format!(
                        "{key} maps to {id}, which is {status:?}, with TTL {ttl}"
                    ));
                }
            }
            _ => {}
        }
    }
    for key in &keys {
        let Some(name) = keys::parse(key) else {
            continue;
        };
        let (KeyKind::Row, Some(shard), Some(id)) = (name.kind, name.shard, name.id) else {
            continue;
        };
        let stored = super::key_bytes(id);
        let (status, t, ddh, deleted) = row(conn, &shard.prefix(), &stored).await;
        let id = super::id_text(&stored);
        let (Some(t), Some(digest)) = (t, ddh) else {
            continue;
        };
        if !live(&status) || deleted.is_some() {
            continue;
        }
        let Ok(tenant) = sluice::domain::TenantId::parse(&t) else {
            continue;
        };
        let mapped: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(shard.dedup_bucket(&tenant, &digest))
            .arg(keys::dedup_field(&digest))
            .query_async(conn)
            .await
            .expect("HGET bucket");
        if mapped.as_ref().is_none_or(|m| mapped_id(m) != stored) {
            let mapped = mapped.map(super::mapping_text);
            found.push(format!(
                "{id} is {status:?} with dedup digest {digest}, but its bucket maps {mapped:?}"
            ));
        }
    }
    found
}

/// The stored id of a mapping's value `<id>:<fingerprint>` (16 hex digits), or layout 5's
/// `<id 16><fingerprint 8>` (24 bytes): by position, as the scripts read it (a binary id may
/// hold ':').
fn mapped_id(mapped: &[u8]) -> &[u8] {
    if mapped.len() == 24 {
        return &mapped[..16];
    }
    &mapped[..mapped.len().saturating_sub(17)]
}
