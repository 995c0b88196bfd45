//! The load generator: HTTP/1 keep-alive connections (one per client task, no pool between),
//! a closed loop (each client sends its next request when the previous one answered) and an
//! open loop (requests scheduled at fixed intervals by a pacing thread, latency measured from
//! the *scheduled* time so a server that falls behind cannot hide its queue), plus latency
//! percentiles and the once-a-second progress line.
//!
//! Long on purpose: one toolkit. The closed, open and batch loops share the connection,
//! `Outcomes`, `collect` and the percentiles, and read best beside each other; the unit tests
//! close the file.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::ADMIN_TOKEN;

/// Upper bound on one HTTP exchange; the server's own request timeout is shorter.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One HTTP/1 keep-alive connection.
pub struct Conn {
    addr: SocketAddr,
    host: String,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connects (TCP_NODELAY, as any latency-sensitive client would).
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self {
            addr,
            host: addr.to_string(),
            sender,
        })
    }

    /// `GET path`; status and body.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<(u16, Bytes)> {
        let req = Request::get(path)
            .header("host", &self.host)
            .body(Full::new(Bytes::new()))?;
        self.exchange(req).await
    }

    /// `method path` as the platform admin acting for `tenant` (empty: for no tenant, without
    /// `X-Tenant-Id`), with a JSON `body` (empty for none); status and body. For the phases
    /// that follow single executions (cancel).
    pub async fn call(
        &mut self,
        method: hyper::Method,
        path: &str,
        admin_token: &str,
        tenant: &str,
        body: &str,
    ) -> anyhow::Result<(u16, Bytes)> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host)
            .header("authorization", format!("Bearer {admin_token}"));
        if !tenant.is_empty() {
            req = req.header("x-tenant-id", tenant);
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned())))?;
        self.exchange(req).await
    }

    /// Sends one request and reads the whole answer. After an error the connection is
    /// replaced, so the caller can go on.
    pub(crate) async fn exchange(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> anyhow::Result<(u16, Bytes)> {
        let result = tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            self.sender.ready().await?;
            let res = self.sender.send_request(req).await?;
            let status = res.status().as_u16();
            let body = res.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        })
        .await
        .context("no answer within 30 s")
        .and_then(|r| r);
        if result.is_err() {
            *self = Self::connect(self.addr).await?;
        }
        result
    }
}

/// What the admission clients send: tenant, key and body of request `i` of client `c`, the
/// same every time for the same `(c, i)`, so a replay is byte-identical to the original.
#[derive(Clone)]
pub struct Workload {
    /// The `sluice serve` under test.
    pub addr: SocketAddr,
    /// Platform admin token: acts for any tenant with `X-Tenant-Id`.
    pub admin_token: String,
    /// Requests go round robin over these.
    pub tenants: Vec<String>,
    /// Distinguishes the keys of phases (a phase's keys never collide with another's).
    pub tag: String,
    /// Flow of every admitted execution (`demo.echo`, so workers can run it).
    pub flow: String,
    /// Concurrency keys per tenant: with N > 0 every request carries a `concurrency_key`, one
    /// of `key-0` ... `key-<N-1>` (spread evenly over clients and requests); 0 = none.
    pub keys: u64,
    /// A tenant API key per tenant (same order as `tenants`): requests then carry the
    /// tenant's key instead of the admin token and `X-Tenant-Id`. Empty: the admin token.
    pub tokens: Vec<String>,
}

impl Workload {
    /// The plain admission load: `demo.echo` for `tenants` as the platform admin, no
    /// concurrency keys, the phase's keys tagged `tag`.
    pub fn echo(addr: SocketAddr, tenants: &[String], tag: &str) -> Self {
        Self {
            addr,
            admin_token: ADMIN_TOKEN.into(),
            tenants: tenants.to_vec(),
            tag: tag.into(),
            flow: "demo.echo".into(),
            keys: 0,
            tokens: Vec::new(),
        }
    }

    /// Tenant, dedup key and JSON body of request `i` of client `c`.
    pub fn request(&self, c: usize, i: u64) -> (&str, String, String) {
        let tenant = &self.tenants[(c + i as usize) % self.tenants.len()];
        let key = format!("{}-{c}-{i}", self.tag);
        let body = if self.keys > 0 {
            // Each client walks every tenant's keys in turn (its requests go round the tenants,
            // so its `i / tenants`-th request to a tenant takes that tenant's next key), each
            // client starting elsewhere: every key of every tenant gets the same share.
            let k = (i / self.tenants.len() as u64 + c as u64 * 7919) % self.keys;
            format!(
                r#"{{"flow_id":"{}","params":{{"n":{i}}},"concurrency_key":"key-{k}"}}"#,
                self.flow
            )
        } else {
            format!(r#"{{"flow_id":"{}","params":{{"n":{i}}}}}"#, self.flow)
        };
        (tenant, key, body)
    }

    pub(crate) fn post(
        &self,
        conn: &Conn,
        tenant: &str,
        key: &str,
        body: String,
    ) -> Request<Full<Bytes>> {
        let own = self
            .tenants
            .iter()
            .position(|t| t == tenant)
            .and_then(|i| self.tokens.get(i));
        let req = Request::post("/api/executions").header("host", &conn.host);
        let req = match own {
            Some(token) => req.header("authorization", format!("Bearer {token}")),
            None => req
                .header("authorization", format!("Bearer {}", self.admin_token))
                .header("x-tenant-id", tenant),
        };
        req.header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("valid request")
    }
}

/// Counters of one load phase.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Outcomes {
    /// 201: a new execution.
    pub created: u64,
    /// 200: a replay answered with the original execution.
    pub replayed: u64,
    /// Replays of a key that had been admitted and yet answered 201 (must be 0).
    pub replay_anomalies: u64,
    /// Any other status, or no answer (must be 0: quotas are set never to reject).
    pub errors: u64,
}

impl Outcomes {
    fn add(&mut self, o: &Outcomes) {
        self.created += o.created;
        self.replayed += o.replayed;
        self.replay_anomalies += o.replay_anomalies;
        self.errors += o.errors;
    }
}

/// Result of a load phase.
pub struct LoadResult {
    pub outcomes: Outcomes,
    /// Per-request latency, microseconds.
    pub latencies: Latencies,
    /// From the first send to the last answer.
    pub elapsed: Duration,
}

/// Shared progress counters, printed once a second by `progress`.
#[derive(Default)]
pub struct Progress {
    /// Requests answered (any status).
    pub done: AtomicU64,
    /// Requests answered with something other than 2xx, or not at all.
    pub errors: AtomicU64,
}

/// Prints `[phase] t=..s done=.. (+../s) errors=..` to stderr every second until `stop`.
pub fn progress(
    phase: &str,
    p: Arc<Progress>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let phase = phase.to_owned();
    tokio::spawn(async move {
        let start = Instant::now();
        let mut last = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let done = p.done.load(Ordering::Relaxed);
            eprintln!(
                "[{phase}] t={:>3.0}s  done={done:>8}  (+{}/s)  errors={}",
                start.elapsed().as_secs_f64(),
                done - last,
                p.errors.load(Ordering::Relaxed)
            );
            last = done;
        }
    })
}

/// Closed loop: `clients` connections each send their next request as soon as the previous one
/// answered, for `duration`. With `replay_percent` > 0, that share of requests re-sends an
/// earlier key of the same client (expecting 200 and the original execution).
pub async fn closed_loop(
    w: &Workload,
    clients: usize,
    duration: Duration,
    replay_percent: u64,
    progress: Arc<Progress>,
) -> anyhow::Result<LoadResult> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for c in 0..clients {
        let w = w.clone();
        let progress = progress.clone();
        let mut conn = Conn::connect(w.addr).await?;
        set.spawn(async move {
            let mut out = Outcomes::default();
            let mut lat = Vec::with_capacity(4096);
            // Which of this client's keys were admitted (201), for replays.
            let mut admitted: Vec<bool> = Vec::new();
            let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1));
            while Instant::now() < deadline {
                let replay = replay_percent > 0
                    && !admitted.is_empty()
                    && rng.next_u64() % 100 < replay_percent;
                let i = if replay {
                    rng.next_u64() % admitted.len() as u64
                } else {
                    admitted.len() as u64
                };
                let (tenant, key, body) = w.request(c, i);
                let req = w.post(&conn, tenant, &key, body);
                let t = Instant::now();
                let status = conn.exchange(req).await.map(|(s, _)| s).unwrap_or(0);
                lat.push(micros(t.elapsed()));
                match (admitted.get(i as usize).copied(), status) {
                    (None, 201) => {
                        out.created += 1;
                        admitted.push(true);
                    }
                    // A new key must be admitted; anything else (200 included) is wrong.
                    (None, _) => {
                        out.errors += 1;
                        admitted.push(false);
                    }
                    (Some(true), 200) => out.replayed += 1,
                    (Some(true), 201) => {
                        out.created += 1;
                        out.replay_anomalies += 1;
                    }
                    // The first try failed; this one admits it (or finds it admitted).
                    (Some(false), 201) => {
                        out.created += 1;
                        admitted[i as usize] = true;
                    }
                    (Some(false), 200) => out.replayed += 1,
                    (Some(_), _) => out.errors += 1,
                }
                progress.done.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(&status) {
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            (out, lat)
        });
    }
    collect(set, start).await
}

/// Closed loop bounded by count: `clients` connections send requests `0..total` (request `k`
/// is `w.request(0, k)`: tenants round robin, every key new), each connection its next as soon
/// as its previous one answered, until all were sent or `limit` passed (the rest are then
/// never sent, and the caller sees fewer answers than `total`). For a backlog of a known size.
pub async fn closed_loop_count(
    w: &Workload,
    clients: usize,
    total: u64,
    limit: Duration,
    progress: Arc<Progress>,
) -> anyhow::Result<LoadResult> {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    for _ in 0..clients.max(1) {
        let (w, progress, next) = (w.clone(), progress.clone(), next.clone());
        let mut conn = Conn::connect(w.addr).await?;
        set.spawn(async move {
            let mut out = Outcomes::default();
            let mut lat = Vec::with_capacity(4096);
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= total || start.elapsed() > limit {
                    break;
                }
                let (tenant, key, body) = w.request(0, k);
                let req = w.post(&conn, tenant, &key, body);
                let t = Instant::now();
                let status = conn.exchange(req).await.map(|(s, _)| s).unwrap_or(0);
                lat.push(micros(t.elapsed()));
                if status == 201 {
                    out.created += 1;
                } else {
                    out.errors += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
                progress.done.fetch_add(1, Ordering::Relaxed);
            }
            (out, lat)
        });
    }
    collect(set, start).await
}

/// Open loop: `rate` requests per second for `duration`, each scheduled at a fixed time by a
/// pacing thread and sent by the next free one of `clients` connections; latency counts from the
/// scheduled time. A request not sent within `duration` + 10 s of the start is abandoned (and
/// counted as an error) so the phase stays bounded even against a server far too slow.
pub async fn open_loop(
    w: &Workload,
    clients: usize,
    rate: f64,
    duration: Duration,
    progress: Arc<Progress>,
) -> anyhow::Result<LoadResult> {
    let total = (rate * duration.as_secs_f64()).floor().max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Conn::connect(w.addr).await?);
    }
    let start = Instant::now() + Duration::from_millis(10);
    let give_up = start + duration + Duration::from_secs(10);
    // A thread, not a tokio timer: std's sleep is precise to tens of microseconds, tokio's
    // timer rounds up to the next millisecond, which at a few thousand requests per second
    // would bunch requests and add its own latency.
    let pacer = std::thread::spawn(move || {
        for k in 0..total {
            let at = start + interval.mul_f64(k as f64);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if tx.send((k, at)).is_err() {
                return;
            }
        }
    });
    let mut set = JoinSet::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let (w, rx, progress) = (w.clone(), rx.clone(), progress.clone());
        set.spawn(async move {
            let mut out = Outcomes::default();
            let mut lat = Vec::with_capacity(4096);
            loop {
                let next = rx.lock().await.recv().await;
                let Some((k, at)) = next else { break };
                if Instant::now() > give_up {
                    out.errors += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let (tenant, key, body) = w.request(c, k);
                let req = w.post(&conn, tenant, &key, body);
                let status = conn.exchange(req).await.map(|(s, _)| s).unwrap_or(0);
                lat.push(micros(at.elapsed()));
                if status == 201 {
                    out.created += 1;
                } else {
                    out.errors += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
                progress.done.fetch_add(1, Ordering::Relaxed);
            }
            (out, lat)
        });
    }
    let result = collect(set, start).await;
    pacer
        .join()
        .map_err(|_| anyhow::anyhow!("pacing thread panicked"))?;
    result
}

async fn collect(
    mut set: JoinSet<(Outcomes, Vec<u32>)>,
    start: Instant,
) -> anyhow::Result<LoadResult> {
    let mut outcomes = Outcomes::default();
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        let (o, lat) = r.context("a load client failed")?;
        outcomes.add(&o);
        all.extend(lat);
    }
    Ok(LoadResult {
        outcomes,
        latencies: Latencies::new(all),
        elapsed: start.elapsed(),
    })
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

/// A tiny deterministic generator for choosing replays (no dependency for this).
struct XorShift(u64);

impl XorShift {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Latency samples in microseconds, sorted.
#[derive(Debug)]
pub struct Latencies(Vec<u32>);

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latencies {
    /// Sorts the samples.
    pub fn new(mut v: Vec<u32>) -> Self {
        v.sort_unstable();
        Self(v)
    }

    /// The `q` quantile (nearest rank), microseconds; 0 without samples.
    pub fn quantile(&self, q: f64) -> u32 {
        if self.0.is_empty() {
            return 0;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    /// p50, p90, p99, p99.9 and max.
    pub fn percentiles(&self) -> Percentiles {
        let ms = |us: u32| f64::from(us) / 1000.0;
        Percentiles {
            p50_ms: ms(self.quantile(0.5)),
            p90_ms: ms(self.quantile(0.9)),
            p99_ms: ms(self.quantile(0.99)),
            p999_ms: ms(self.quantile(0.999)),
            max_ms: ms(self.0.last().copied().unwrap_or(0)),
            samples: self.0.len(),
        }
    }
}

/// Batch admission: one client per tenant of `w` (one batch per tenant at a time), each
/// sending `POST /api/executions/batch` of `size` items with unique dedup keys back to back
/// for `duration`. `outcomes.created` counts items answered 201; a latency is one batch's.
pub async fn batch_loop(
    w: &Workload,
    size: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> anyhow::Result<LoadResult> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for (c, tenant) in w.tenants.iter().enumerate() {
        let (w, tenant, progress) = (w.clone(), tenant.clone(), progress.clone());
        let mut conn = Conn::connect(w.addr).await?;
        set.spawn(async move {
            let mut out = Outcomes::default();
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                // A batch's JSON (a thousand items each way) is built and read on a blocking
                // thread: on this runtime's one thread it would stall the single admissions
                // measured beside it, and count against the server.
                let (flow, tag, first) = (w.flow.clone(), w.tag.clone(), i);
                i += size as u64;
                let body = tokio::task::spawn_blocking(move || {
                    let items: Vec<String> = (first + 1..=first + size as u64)
                        .map(|i| {
                            format!(
                                r#"{{"flow_id":"{flow}","params":{{"n":{i}}},"dedup_key":"{tag}-{c}-{i}"}}"#
                            )
                        })
                        .collect();
                    format!(r#"{{"items":[{}]}}"#, items.join(","))
                })
                .await
                .expect("batch body");
                let t = Instant::now();
                let answer = conn
                    .call(
                        hyper::Method::POST,
                        "/api/executions/batch",
                        &w.admin_token,
                        &tenant,
                        &body,
                    )
                    .await;
                lat.push(micros(t.elapsed()));
                match answer {
                    Ok((200, bytes)) => {
                        let created = tokio::task::spawn_blocking(move || {
                            let v: serde_json::Value =
                                serde_json::from_slice(&bytes).unwrap_or_default();
                            let results =
                                v["results"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                            results.iter().filter(|r| r["status"] == 201).count()
                        })
                        .await
                        .expect("batch answer");
                        out.created += created as u64;
                        out.errors += (size - created) as u64;
                        progress.done.fetch_add(size as u64, Ordering::Relaxed);
                        if created < size {
                            progress
                                .errors
                                .fetch_add((size - created) as u64, Ordering::Relaxed);
                        }
                    }
                    _ => {
                        out.errors += size as u64;
                        progress.errors.fetch_add(size as u64, Ordering::Relaxed);
                    }
                }
            }
            (out, lat)
        });
    }
    collect(set, start).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let l = Latencies::new((1..=1000).rev().collect());
        assert_eq!(l.quantile(0.5), 500);
        assert_eq!(l.quantile(0.99), 990);
        assert_eq!(l.quantile(0.999), 999);
        assert_eq!(l.quantile(1.0), 1000);
        assert_eq!(Latencies::new(vec![]).quantile(0.5), 0);
    }

    #[test]
    fn a_request_is_the_same_every_time() {
        let w = Workload {
            addr: "127.0.0.1:1".parse().unwrap(),
            admin_token: "t".into(),
            tenants: vec!["a".into(), "b".into()],
            tag: "x".into(),
            flow: "demo.echo".into(),
            keys: 0,
            tokens: Vec::new(),
        };
        assert_eq!(w.request(1, 7), w.request(1, 7));
        assert_ne!(w.request(1, 7).1, w.request(2, 7).1);
        assert_eq!(
            w.request(1, 7).2,
            r#"{"flow_id":"demo.echo","params":{"n":7}}"#
        );
        let keyed = Workload { keys: 1000, ..w };
        // Request 7 of client 0 goes to tenant b, its 4th there: key 3, which comes back for b
        // after all 1000 keys (2 tenants × 1000 requests later).
        assert_eq!(keyed.request(0, 7).0, "b");
        assert_eq!(
            keyed.request(0, 7).2,
            r#"{"flow_id":"demo.echo","params":{"n":7},"concurrency_key":"key-3"}"#
        );
        assert_eq!(keyed.request(0, 9).2.matches("\"key-4\"").count(), 1);
        assert_eq!(keyed.request(0, 2007).2.matches("\"key-3\"").count(), 1);
    }
}
