//! The batch-memory phase (issue 38, defect 3): whether one batch admission can take the
//! server's memory, and whether it slows another tenant down meanwhile.
//!
//! A `sluice serve` of its own (its peak RSS is this phase's alone) runs with
//! `--batch-body-limit` `--batch-memory-body-limit` (16 MiB; `--smoke`: 256 KiB) and otherwise
//! the defaults, so `--batch-memory-limit` is its default, four full batches. Four tenants
//! then send one body each at that limit, all four at once, round after round for
//! `--batch-memory-secs` (4):
//!
//! - `elements`: the attack of issue 38: `{"items": [0,0,0,...]}`, eight million tiny elements
//!   at 16 MiB (answered 400 `invalid_batch` as the 1,001st begins; the rest is never read);
//! - `string params`: 1,000 items whose params are one string of about a thousandth of the
//!   limit (16 KB at 16 MiB): all admitted, and the answer echoes every one;
//! - `number params`: 1,000 items whose params are an array of small numbers of the same size
//!   (a parsed tree of such params is over 30 times their text): all admitted;
//! - `one item`: one item whose params are the whole body (answered 413 `params_too_large`
//!   for that item, unparsed).
//!
//! Meanwhile another tenant sends `GET /api/me` and single admissions, each at
//! `--batch-memory-rate` (200/s), open loop (latency from the scheduled time). Serve's RSS is
//! read from `/proc/<pid>/status` every 2 ms (and its `VmHWM` at the end). Reported: the peak
//! RSS rise over the RSS before the first round, against 4 × the limit (target: at most), and
//! the other tenant's p99 of both calls (targets: at most 5 ms). Checked: every answer is the
//! one above (a `429 batch_memory_full` fails the check: four bodies at the limit fit the
//! default budget), the other tenant's calls all succeed, and Redis holds exactly what was
//! admitted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::direct::Direct;
use crate::harness::{Pids, check_queued};
use crate::load::{Conn, Latencies, LoadResult, Outcomes};
use crate::procs;
use crate::push::Ctx;
use crate::report::{BatchMemory, BatchMemoryShape, Check};
use crate::{ADMIN_TOKEN, UNLIMITED};

/// The run's tenants this phase uses: four send the bodies, one is timed beside them, one
/// warms the server up (the benchmark's census knows only the run's tenants).
struct Tenants {
    bodies: Vec<String>,
    calm: String,
    warm: String,
}

impl Tenants {
    fn of(run: &[String]) -> anyhow::Result<Self> {
        anyhow::ensure!(
            run.len() >= 6,
            "the batch-memory phase needs 6 tenants (--tenants)"
        );
        Ok(Self {
            bodies: run[..4].to_vec(),
            calm: run[4].clone(),
            warm: run[5].clone(),
        })
    }
}

/// The most rounds of four bodies, whatever the duration.
const MAX_ROUNDS: usize = 100;

/// One round: each body's shape and what it was answered.
type Round = Vec<(Shape, anyhow::Result<RawAnswer>)>;

/// What each of the four bodies is, and what its answer must be.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Elements,
    StringParams,
    NumberParams,
    OneItem,
}

impl Shape {
    const ALL: [Shape; 4] = [
        Shape::Elements,
        Shape::StringParams,
        Shape::NumberParams,
        Shape::OneItem,
    ];

    fn name(self) -> &'static str {
        match self {
            Shape::Elements => "elements",
            Shape::StringParams => "string params",
            Shape::NumberParams => "number params",
            Shape::OneItem => "one item",
        }
    }

    /// The body, `limit` bytes long or a little less.
    fn body(self, limit: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(limit);
        b.extend_from_slice(b"{\"items\":[");
        match self {
            Shape::Elements => {
                while b.len() + 4 < limit {
                    b.extend_from_slice(b"0,");
                }
                b.push(b'0');
            }
            Shape::StringParams | Shape::NumberParams => {
                // 1,000 items sharing the limit, with room for their own text.
                let per_item = limit.saturating_sub(16) / 1_000;
                for i in 0..1_000 {
                    if i > 0 {
                        b.push(b',');
                    }
                    let start = b.len();
                    b.extend_from_slice(b"{\"flow_id\":\"demo.echo\",\"params\":{\"p\":");
                    let room = per_item.saturating_sub(b.len() - start + 4).max(2);
                    if let Shape::StringParams = self {
                        b.push(b'"');
                        b.resize(b.len() + room.saturating_sub(2), b'x');
                        b.push(b'"');
                    } else {
                        b.push(b'[');
                        for k in 0..room.saturating_sub(2) / 2 {
                            if k > 0 {
                                b.push(b',');
                            }
                            b.push(b'0' + (k % 10) as u8);
                        }
                        b.push(b']');
                    }
                    b.extend_from_slice(b"}}");
                }
            }
            Shape::OneItem => {
                b.extend_from_slice(b"{\"flow_id\":\"demo.echo\",\"params\":{\"p\":\"");
                b.resize(limit.saturating_sub(6), b'x');
                b.extend_from_slice(b"\"}}");
            }
        }
        b.extend_from_slice(b"]}");
        b
    }

    /// Whether `answer` is what this body must get, and how many executions it admitted.
    fn judge(self, answer: &RawAnswer) -> (bool, u64) {
        let statuses: Vec<u16> = answer.body.results.iter().map(|r| r.status).collect();
        let created = statuses.iter().filter(|&&s| s == 201).count() as u64;
        let first_code = answer
            .body
            .results
            .first()
            .and_then(|r| r.problem.as_ref())
            .map(|p| p.code.as_str());
        let ok = match self {
            Shape::Elements => {
                answer.status == 400 && answer.body.code.as_deref() == Some("invalid_batch")
            }
            Shape::StringParams | Shape::NumberParams => {
                answer.status == 200 && statuses.len() == 1_000 && created == 1_000
            }
            Shape::OneItem => {
                answer.status == 200 && statuses == [413] && first_code == Some("params_too_large")
            }
        };
        (ok, created)
    }
}

/// An answer read off a raw connection.
struct RawAnswer {
    status: u16,
    body: AnswerBody,
}

/// What the phase reads of an answer: a batch's results (each one's status and problem code;
/// the executions are skipped, not built), or a problem's code.
#[derive(Debug, Default, Deserialize)]
struct AnswerBody {
    #[serde(default)]
    results: Vec<ItemAnswer>,
    #[serde(default)]
    code: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ItemAnswer {
    status: u16,
    #[serde(default)]
    problem: Option<ItemProblem>,
}

#[derive(Debug, Deserialize)]
struct ItemProblem {
    code: String,
}

/// POSTs `body` as a batch of `tenant` on a connection of its own, writing while reading: the
/// server may answer (and close) before the body is all sent.
async fn send_batch(
    addr: SocketAddr,
    tenant: &str,
    body: Arc<Vec<u8>>,
) -> anyhow::Result<RawAnswer> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST /api/executions/batch HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer \
         {ADMIN_TOKEN}\r\nX-Tenant-Id: {tenant}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&body).await?;
        // Keep the write half open until the answer is read: a shutdown would end the request.
        std::future::pending::<()>().await;
        std::io::Result::Ok(())
    });
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(_) if !bytes.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    writer.abort();
    read.context("no answer within 60 s")??;
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("an answer without a head")?;
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    let raw = &bytes[end + 4..];
    let data = if head.contains("transfer-encoding: chunked") {
        dechunk(raw)?
    } else {
        raw.to_vec()
    };
    Ok(RawAnswer {
        status,
        body: serde_json::from_slice(&data).unwrap_or_default(),
    })
}

fn dechunk(mut raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk without its size")?;
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line])?.trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        let data = raw
            .get(line + 2..line + 2 + size)
            .context("a chunk cut short")?;
        out.extend_from_slice(data);
        raw = raw.get(line + 2 + size + 2..).unwrap_or_default();
    }
}

/// Resident and peak resident memory of a process, KiB (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One timed call of the calm tenant: `GET /api/me` or a single admission.
#[derive(Clone, Copy)]
enum Call {
    Me,
    Admit,
}

/// The calm tenant's calls of one kind at `rate` for `duration`, open loop: each scheduled by a
/// pacing thread, sent by the next free of two connections, timed from its schedule.
/// Latencies, successes and failures.
async fn calm_calls(
    addr: SocketAddr,
    tenant: &str,
    call: Call,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<(Latencies, u64, u64)> {
    let total = (rate * duration.as_secs_f64()).floor().max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let start = Instant::now() + Duration::from_millis(10);
    let give_up = start + duration + Duration::from_secs(10);
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
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let mut conn = Conn::connect(addr).await?;
        let (rx, tenant) = (rx.clone(), tenant.to_owned());
        set.spawn(async move {
            let (mut lat, mut ok, mut failed) = (Vec::new(), 0u64, 0u64);
            loop {
                let next = rx.lock().await.recv().await;
                let Some((k, at)) = next else { break };
                if Instant::now() > give_up {
                    failed += 1;
                    continue;
                }
                let answer = match call {
                    Call::Me => {
                        conn.call(hyper::Method::GET, "/api/me", ADMIN_TOKEN, &tenant, "")
                            .await
                    }
                    Call::Admit => {
                        let body = format!(r#"{{"flow_id":"demo.echo","params":{{"n":{k}}}}}"#);
                        conn.call(
                            hyper::Method::POST,
                            "/api/executions",
                            ADMIN_TOKEN,
                            &tenant,
                            &body,
                        )
                        .await
                    }
                };
                lat.push(at.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                match (call, answer.map(|(s, _)| s)) {
                    (Call::Me, Ok(200)) | (Call::Admit, Ok(201)) => ok += 1,
                    _ => failed += 1,
                }
            }
            (lat, ok, failed)
        });
    }
    let (mut all, mut ok, mut failed) = (Vec::new(), 0, 0);
    while let Some(r) = set.join_next().await {
        let (lat, o, f) = r.context("a calm client failed")?;
        all.extend(lat);
        ok += o;
        failed += f;
    }
    pacer
        .join()
        .map_err(|_| anyhow::anyhow!("pacing thread panicked"))?;
    Ok((Latencies::new(all), ok, failed))
}

/// Runs the phase on a `serve` of its own beside the run's Redis; its numbers and its check.
pub(crate) async fn batch_memory(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
) -> anyhow::Result<(BatchMemory, Check)> {
    let args = ctx.args;
    let limit = args.batch_memory_body_limit;
    direct.reset().await?;
    let (serve, addr) = procs::start_serve_as(
        "serve-batch-memory",
        &["--batch-body-limit".to_owned(), limit.to_string()],
        ctx.cmd,
        ctx.scratch,
        ADMIN_TOKEN,
        UNLIMITED,
        UNLIMITED,
    )
    .await?;
    let pid = serve.pid().context("serve exited")?;
    let tenants = Tenants::of(ctx.tenants)?;
    let bodies: Vec<(Shape, Arc<Vec<u8>>)> = Shape::ALL
        .iter()
        .map(|&s| (s, Arc::new(s.body(limit))))
        .collect();
    // Warm up: the calls the phase makes, so the baseline has its threads and connections.
    let mut warm = Conn::connect(addr).await?;
    for _ in 0..20 {
        warm.call(
            hyper::Method::GET,
            "/api/me",
            ADMIN_TOKEN,
            &tenants.calm,
            "",
        )
        .await?;
        let (status, _) = warm
            .call(
                hyper::Method::POST,
                "/api/executions",
                ADMIN_TOKEN,
                &tenants.calm,
                r#"{"flow_id":"demo.echo"}"#,
            )
            .await?;
        anyhow::ensure!(status == 201, "a warm-up admission answered {status}");
    }
    let warm_batch = send_batch(
        addr,
        &tenants.warm,
        Arc::new(br#"{"items":[{"flow_id":"demo.echo"}]}"#.to_vec()),
    )
    .await?;
    anyhow::ensure!(
        warm_batch.status == 200,
        "a warm-up batch answered {}",
        warm_batch.status
    );
    // The warm-up's 20 single admissions and its batch's one.
    let warm_created = 21;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (baseline_kib, hwm_before_kib) = memory_kib(pid).context("serve's /proc status")?;

    // RSS, every 2 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(baseline_kib));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((rss, _)) = memory_kib(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let secs = Duration::from_secs_f64(args.batch_memory_secs.max(0.1));
    let rate = args.batch_memory_rate;
    // CPU of this serve, Redis and the benchmark, and the rest of the machine (other work on
    // a shared machine shows there).
    let mut measured: Vec<&procs::Proc> = ctx
        .others
        .iter()
        .copied()
        .filter(|p| p.name.starts_with("redis"))
        .collect();
    measured.push(&serve);
    let pids = Pids::of(&measured);
    let cpu_before = pids.sample();
    let started = Instant::now();
    // The bodies go out from a thread and runtime of their own: writing 64 MiB and reading
    // the answers must not delay the timed calls' clients, only the server may.
    let attack = {
        let (bodies, senders) = (bodies.clone(), tenants.bodies.clone());
        std::thread::spawn(move || -> anyhow::Result<Vec<Round>> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut rounds = Vec::new();
                while rounds.is_empty() || (started.elapsed() < secs && rounds.len() < MAX_ROUNDS) {
                    // All four at once, each on its own connection.
                    let sends: Vec<_> = bodies
                        .iter()
                        .zip(&senders)
                        .map(|((shape, body), tenant)| {
                            let (shape, body, tenant) = (*shape, body.clone(), tenant.clone());
                            tokio::spawn(
                                async move { (shape, send_batch(addr, &tenant, body).await) },
                            )
                        })
                        .collect();
                    let mut round = Vec::with_capacity(sends.len());
                    for send in sends {
                        round.push(send.await.context("a batch sender failed")?);
                    }
                    rounds.push(round);
                }
                Ok(rounds)
            })
        })
    };
    let calm = tokio::try_join!(
        calm_calls(addr, &tenants.calm, Call::Me, rate, secs),
        calm_calls(addr, &tenants.calm, Call::Admit, rate, secs)
    );
    // The calm calls end with the duration; the rounds with the last one begun by then.
    let rounds = tokio::task::spawn_blocking(move || attack.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the batch senders' thread panicked"))??;
    let elapsed = started.elapsed();
    let cpu = pids.since(&cpu_before, elapsed);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let ((me, me_ok, me_failed), (admit, admit_ok, admit_failed)) = calm?;
    let (_, hwm_after_kib) = memory_kib(pid).context("serve's /proc status")?;
    let mut peak_kib = peak.load(Ordering::Relaxed);
    if hwm_after_kib > hwm_before_kib {
        peak_kib = peak_kib.max(hwm_after_kib);
    }
    serve.kill().await;

    let mut shapes: Vec<BatchMemoryShape> = bodies
        .iter()
        .map(|(s, b)| BatchMemoryShape {
            name: s.name(),
            bytes: b.len(),
            sent: 0,
            as_expected: 0,
            refused_for_memory: 0,
            failed: Vec::new(),
        })
        .collect();
    let mut created = 0;
    for round in &rounds {
        for (i, (shape, answer)) in round.iter().enumerate() {
            let s = &mut shapes[i];
            s.sent += 1;
            match answer {
                Ok(a) => {
                    let (ok, n) = shape.judge(a);
                    created += n;
                    if ok {
                        s.as_expected += 1;
                    } else {
                        if a.status == 429 {
                            s.refused_for_memory += 1;
                        }
                        if s.failed.len() < 3 {
                            let code = a.body.code.as_deref().unwrap_or("");
                            s.failed.push(format!("{} {code}", a.status));
                        }
                    }
                }
                Err(e) => {
                    if s.failed.len() < 3 {
                        s.failed.push(format!("no answer: {e:#}"));
                    }
                }
            }
        }
    }
    let unexpected: u64 = shapes.iter().map(|s| s.sent - s.as_expected).sum();
    let result = LoadResult {
        outcomes: Outcomes {
            created: created + admit_ok + warm_created,
            errors: unexpected + me_failed + admit_failed,
            ..Outcomes::default()
        },
        latencies: Latencies::new(Vec::new()),
        elapsed: started.elapsed(),
    };
    let (mut check, _) = check_queued("batch memory", &result, direct).await?;
    check.detail = format!(
        "{} rounds of 4 bodies: {}; other tenant: {me_ok} /api/me, {admit_ok} admitted, {} \
         failed; {}",
        rounds.len(),
        shapes
            .iter()
            .map(|s| format!(
                "{} {}/{} as expected{}",
                s.name,
                s.as_expected,
                s.sent,
                if s.failed.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", s.failed.join(", "))
                }
            ))
            .collect::<Vec<_>>()
            .join(", "),
        me_failed + admit_failed,
        check.detail
    );
    let report = BatchMemory {
        body_limit: limit,
        rounds: rounds.len(),
        secs: elapsed.as_secs_f64(),
        shapes,
        baseline_rss_kib: baseline_kib,
        peak_rss_kib: peak_kib,
        rise_kib: peak_kib.saturating_sub(baseline_kib),
        rise_limit_kib: (4 * limit / 1024) as u64,
        rate,
        me: me.percentiles(),
        admission: admit.percentiles(),
        cpu,
    };
    Ok((report, check))
}
