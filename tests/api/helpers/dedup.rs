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
        id: &str,
    ) -> (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        redis::cmd("HMGET")
            .arg(format!("{prefix}exec:{id}"))
            .arg(&[row::STATUS, row::TENANT, row::DEDUP_DIGEST, row::DELETED])
            .query_async(conn)
            .await
            .expect("HMGET row")
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
                let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                    .arg(key)
                    .query_async(conn)
                    .await
                    .expect("HGETALL bucket");
                for (field, mapped) in fields {
                    let id = mapped.split(':').next().unwrap_or_default();
                    let (status, t, ddh, deleted) = row(conn, &prefix, id).await;
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
                let (mapped, ttl): (Option<String>, i64) = redis::pipe()
                    .get(key)
                    .ttl(key)
                    .query_async(conn)
                    .await
                    .expect("GET, TTL mapping");
                let Some(mapped) = mapped else { continue };
                let id = mapped.split(':').next().unwrap_or_default();
                let (status, ..) = row(conn, &prefix, id).await;
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
        let (status, t, ddh, deleted) = row(conn, &shard.prefix(), id).await;
        let (Some(t), Some(digest)) = (t, ddh) else {
            continue;
        };
        if !live(&status) || deleted.is_some() {
            continue;
        }
        let Ok(tenant) = sluice::domain::TenantId::parse(&t) else {
            continue;
        };
        let mapped: Option<String> = redis::cmd("HGET")
            .arg(shard.dedup_bucket(&tenant, &digest))
            .arg(keys::dedup_field(&digest))
            .query_async(conn)
            .await
            .expect("HGET bucket");
        if !mapped
            .as_ref()
            .is_some_and(|m| m.starts_with(&format!("{id}:")))
        {
            found.push(format!(
                "{id} is {status:?} with dedup digest {digest}, but its bucket maps {mapped:?}"
            ));
        }
    }
    found
}
