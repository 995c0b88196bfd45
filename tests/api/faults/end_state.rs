//! The end state: waiting until the system has finished its work after the faults
//! (`quiesce`), then reading what it holds (`Final`): every execution through the listing
//! (and any row on Redis the listing missed), each tenant's usage, the dead letters, the
//! shards' counters and their start logs. Separate from the checker, which only judges what
//! this collected.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::TENANTS;
use super::load::{Answer, Api};

/// Waits until every tenant's usage is zero and nothing is listed queued or running; on
/// timeout, what was still busy.
pub(super) async fn quiesce(api: &Api, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut busy = Vec::new();
    while start.elapsed() < limit {
        busy.clear();
        for t in TENANTS {
            let tenant = api.read(None, &format!("/api/tenants/{t}")).await;
            let usage = &tenant["usage"];
            if usage != &json!({"running": 0, "waiting": 0, "scheduled": 0}) {
                busy.push(format!("{t} usage {usage}"));
            }
            for status in ["queued", "running"] {
                let page = api
                    .read(Some(t), &format!("/api/executions?status={status}&limit=1"))
                    .await;
                if page["total"] != 0 {
                    busy.push(format!("{t} {status} {}", page["total"]));
                }
            }
        }
        if busy.is_empty() {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(busy.join(", "))
}

/// What the system holds at the end.
pub(super) struct Final {
    /// Every execution, by id (API bodies).
    pub(super) execs: BTreeMap<String, Value>,
    /// Ids the listing returned more than once.
    pub(super) listed_twice: Vec<String>,
    /// Rows found on Redis that no listing returned.
    pub(super) unlisted: Vec<String>,
    pub(super) usage: BTreeMap<String, Value>,
    pub(super) dead_letters: Vec<Value>,
    pub(super) counters: BTreeMap<String, u64>,
    /// Dedup mappings out of place (`crate::helpers::dedup_orphans`): with everything ended,
    /// a bucket field left, or a string mapping without its TTL.
    pub(super) dedup_orphans: Vec<String>,
    /// Each shard's start log: (tenant, virtual start tag, weight) per start, oldest first.
    pub(super) start_logs: BTreeMap<String, Vec<(String, f64, f64, u64)>>,
}

pub(super) async fn final_state(api: &Api, redis_url: &str) -> Final {
    let mut execs = BTreeMap::new();
    let mut listed_twice = Vec::new();
    let mut usage = BTreeMap::new();
    for t in TENANTS {
        let mut cursor: Option<String> = None;
        for _ in 0..10_000 {
            let path = match &cursor {
                Some(c) => format!("/api/executions?limit=200&cursor={c}"),
                None => "/api/executions?limit=200".into(),
            };
            let page = api.read(Some(t), &path).await;
            for e in page["executions"].as_array().into_iter().flatten() {
                let id = e["execution_id"].as_str().unwrap_or_default().to_owned();
                if execs.insert(id.clone(), e.clone()).is_some() {
                    listed_twice.push(id);
                }
            }
            cursor = page["next_cursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        usage.insert(
            t.to_owned(),
            api.read(None, &format!("/api/tenants/{t}")).await["usage"].clone(),
        );
    }

    // Rows on Redis the listing missed (indexes out of step with rows).
    let mut unlisted = Vec::new();
    let mut conn = redis::Client::open(redis_url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection after healing");
    let mut start_logs = BTreeMap::new();
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("sluice:{*}:starts")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        for key in keys {
            let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .expect("XRANGE");
            let log = entries
                .into_iter()
                .map(|(id, f)| {
                    let get = |n: &str| {
                        f.chunks(2)
                            .find(|c| c[0] == n)
                            .map(|c| c[1].clone())
                            .unwrap_or_default()
                    };
                    (
                        get("t"),
                        get("vt").parse().unwrap_or(f64::NAN),
                        get("w").parse().unwrap_or(f64::NAN),
                        // The entry id is the start's time on Redis's clock (ms).
                        id.split('-')
                            .next()
                            .and_then(|ms| ms.parse().ok())
                            .unwrap_or(0),
                    )
                })
                .collect();
            start_logs.insert(key, log);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(sluice::store::keys::row_pattern())
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        for key in keys {
            let Some(id) = sluice::store::keys::parse(&key).and_then(|n| n.id) else {
                continue;
            };
            let id = id.to_owned();
            if execs.contains_key(&id) {
                continue;
            }
            let tenant: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg(sluice::domain::row::TENANT)
                .query_async(&mut conn)
                .await
                .expect("HGET");
            let Some(tenant) = tenant else { continue };
            let body = api
                .call(
                    Method::GET,
                    &format!("/api/executions/{id}"),
                    Some(&tenant),
                    None,
                    None,
                )
                .await;
            let row = match body {
                Answer::Http { status: 200, body } => body,
                other => {
                    json!({"execution_id": id, "tenant_id": tenant, "unreadable": other.label()})
                }
            };
            unlisted.push(id.clone());
            execs.insert(id, row);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }

    // Every key, for the dedup mappings' check (the suite runs on one server).
    let mut all_keys = Vec::new();
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        all_keys.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let dedup_orphans = crate::helpers::dedup_orphans(&mut conn, all_keys).await;

    let mut dead_letters = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..10_000 {
        let path = match &before {
            Some(b) => format!("/api/dlq?limit=200&before={b}"),
            None => "/api/dlq?limit=200".into(),
        };
        let page = api.read(None, &path).await;
        dead_letters.extend(page["dead_letters"].as_array().cloned().unwrap_or_default());
        before = page["next_before"].as_str().map(str::to_owned);
        if before.is_none() {
            break;
        }
    }
    let mut counters = BTreeMap::new();
    let queues = api.read(None, "/api/queues").await;
    for shard in queues["shards"].as_array().into_iter().flatten() {
        if let Some(c) = shard["counters"].as_object() {
            for (k, v) in c {
                *counters.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
    }
    Final {
        execs,
        listed_twice,
        unlisted,
        usage,
        dead_letters,
        counters,
        dedup_orphans,
        start_logs,
    }
}
