//! The load: the HTTP API as the platform admin (`Api`, and what a request got back,
//! `Answer`), and the client tasks that admit, cancel, retry, read and change limits while the
//! faults run, recording every request with its answer and its send and answer times (`Rec`)
//! for the checker. Separate from the faults and the processes: this is the traffic the
//! guarantees are about, and the checker judges the system by these records.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::journal::{Run, read_journal};
use super::{FLOW, Rng, TENANTS, now_ms};
use crate::helpers::ADMIN_TOKEN;

/// The HTTP API as the platform admin.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
}

/// What a request got back.
#[derive(Debug, Clone)]
pub(super) enum Answer {
    /// An HTTP answer with its (JSON, else null) body.
    Http { status: u16, body: Value },
    /// No answer: a transport error or the client's timeout. Anything may have happened.
    Lost(String),
}

impl Answer {
    pub(super) fn status(&self) -> Option<u16> {
        match self {
            Answer::Http { status, .. } => Some(*status),
            Answer::Lost(_) => None,
        }
    }

    pub(super) fn is_2xx(&self) -> bool {
        self.status().is_some_and(|s| (200..300).contains(&s))
    }

    /// 4xx: the request was refused and changed nothing.
    pub(super) fn is_refusal(&self) -> bool {
        self.status().is_some_and(|s| (400..500).contains(&s))
    }

    pub(super) fn body(&self) -> &Value {
        match self {
            Answer::Http { body, .. } => body,
            Answer::Lost(_) => &Value::Null,
        }
    }

    pub(super) fn code(&self) -> Option<&str> {
        self.body()["code"].as_str()
    }

    /// `execution_id` of a 2xx body or of a problem that names one.
    pub(super) fn execution_id(&self) -> Option<&str> {
        self.body()["execution_id"].as_str()
    }

    /// The label, with the transport error of a lost answer (for violation messages).
    pub(super) fn detail(&self) -> String {
        match self {
            Answer::Lost(why) => format!("no answer ({why})"),
            _ => self.label(),
        }
    }

    /// `201`, `503 redis_unavailable`, `no answer`: how the report groups answers.
    pub(super) fn label(&self) -> String {
        match self {
            Answer::Lost(_) => "no answer".into(),
            Answer::Http { status, .. } => match self.code() {
                Some(code) if *status >= 400 => format!("{status} {code}"),
                _ => status.to_string(),
            },
        }
    }
}

impl Api {
    pub(super) fn new(port: u16) -> Self {
        Self {
            http: sluice::tls::client_builder(&[])
                .unwrap()
                // Above serve's own 5 s request timeout: a paused serve still answers.
                .timeout(Duration::from_secs(7))
                .connect_timeout(Duration::from_secs(2))
                .build()
                .expect("http client"),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        tenant: Option<&str>,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(t) = tenant {
            req = req.header("X-Tenant-Id", t);
        }
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        match req.send().await {
            Err(e) => Answer::Lost(e.to_string()),
            Ok(res) => {
                let status = res.status().as_u16();
                match res.bytes().await {
                    Ok(b) => Answer::Http {
                        status,
                        body: serde_json::from_slice(&b).unwrap_or(Value::Null),
                    },
                    Err(e) => Answer::Lost(format!("status {status}, body lost: {e}")),
                }
            }
        }
    }

    /// A read for the checker, after healing: retried a few times over a transient error.
    pub(super) async fn read(&self, tenant: Option<&str>, path: &str) -> Value {
        let mut last = String::new();
        for _ in 0..10 {
            match self.call(Method::GET, path, tenant, None, None).await {
                Answer::Http { status: 200, body } => return body,
                other => last = format!("{other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("GET {path} kept failing after the faults were healed: {last}");
    }
}

/// One request a client made.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Admit {
        tenant: String,
        nonce: String,
        key: Option<String>,
        try_no: u32,
    },
    Cancel {
        tenant: String,
        id: String,
    },
    Retry {
        id: String,
    },
    Limit {
        tenant: String,
        max_concurrent: u64,
    },
}

/// A request, its answer and when (wall-clock ms).
#[derive(Debug, Clone)]
pub(super) struct Rec {
    pub(super) op: Op,
    pub(super) sent: u64,
    pub(super) done: u64,
    pub(super) answer: Answer,
}

/// What an admission asked for (by execution id).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// `params.ms`: how long each run sleeps.
    pub(super) ms: u64,
    max_attempts: u64,
    /// The admission's `delay` (ms), if it was scheduled.
    pub(super) delay: Option<u64>,
}

/// What the client tasks share.
pub(super) struct Clients {
    pub(super) api: Api,
    pub(super) seed: u64,
    pub(super) until: Instant,
    pub(super) log: Mutex<Vec<Rec>>,
    /// Executions some admission named: (tenant, id), targets of cancels and retries.
    pub(super) known: Mutex<Vec<(String, String)>>,
    /// Executions last seen cancelled or failed: the likeliest to accept a retry.
    pub(super) ended: Mutex<Vec<(String, String)>>,
    /// What each named execution was asked to do, to aim faults, cancels and retries.
    pub(super) plans: Mutex<HashMap<String, Plan>>,
    /// The workers' journal, to aim cancels at runs about to end.
    pub(super) journal: PathBuf,
}

impl Clients {
    fn record(&self, op: Op, sent: u64, answer: &Answer) {
        self.log.lock().expect("log").push(Rec {
            op,
            sent,
            done: now_ms(),
            answer: answer.clone(),
        });
    }

    fn any_known(&self, rng: &mut Rng) -> Option<(String, String)> {
        let known = self.known.lock().expect("known");
        (!known.is_empty()).then(|| rng.pick(&known).clone())
    }

    /// Often an execution whose run the journal shows ending within 300 ms (its worker will
    /// report the outcome before a heartbeat can tell it of the cancel: the completion races
    /// the cancel), else mostly one of the latest admissions (likely waiting or running), else
    /// any.
    fn cancel_target(&self, rng: &mut Rng, journal: &Path) -> Option<(String, String)> {
        let (closing, pick) = (rng.percent(40), rng.next());
        if closing {
            let runs = read_journal(journal).runs;
            let now = now_ms();
            let plans = self.plans.lock().expect("plans");
            let ending: Vec<&Run> = runs
                .iter()
                .filter(|r| r.end.is_none())
                .filter(|r| {
                    plans
                        .get(&r.id)
                        .is_some_and(|p| (now..now + 300).contains(&(r.start + p.ms)))
                })
                .collect();
            if !ending.is_empty() {
                let r = ending[(pick % ending.len() as u64) as usize];
                return Some((r.tenant.clone(), r.id.clone()));
            }
        }
        let known = self.known.lock().expect("known");
        if known.is_empty() {
            return None;
        }
        let recent = &known[known.len().saturating_sub(8)..];
        let from = if rng.percent(75) { recent } else { &known[..] };
        Some(rng.pick(from).clone())
    }

    /// Often an execution whose latest journaled run was stopped (cancelled) or failed its
    /// last attempt: it ran, so a retry must give it a fence it never had (the case a reset
    /// fence gets wrong); else mostly one last seen cancelled or failed, else any.
    fn retry_target(&self, rng: &mut Rng, journal: &Path) -> Option<(String, String)> {
        let (ran, pick, seen) = (rng.percent(50), rng.next(), rng.percent(70));
        if ran {
            let runs = read_journal(journal).runs;
            let plans = self.plans.lock().expect("plans");
            let mut latest: HashMap<&str, &Run> = HashMap::new();
            for r in &runs {
                latest.insert(&r.id, r);
            }
            let over: Vec<&Run> = latest
                .values()
                .filter(|r| {
                    r.end.as_ref().is_some_and(|e| {
                        e.how == "stopped"
                            || (e.how == "fail"
                                && plans
                                    .get(&r.id)
                                    .is_some_and(|p| r.attempt >= p.max_attempts))
                    })
                })
                .copied()
                .collect();
            if !over.is_empty() {
                let r = over[(pick % over.len() as u64) as usize];
                return Some((r.tenant.clone(), r.id.clone()));
            }
        }
        let target = {
            let ended = self.ended.lock().expect("ended");
            (!ended.is_empty() && seen).then(|| rng.pick(&ended).clone())
        };
        target.or_else(|| self.any_known(rng))
    }

    /// Remembers an execution that may accept a retry (cancelled, failed, or about to be).
    fn note_status(&self, tenant: &str, id: &str, body: &Value) {
        if matches!(body["status"].as_str(), Some("cancelled" | "failed"))
            || body["cancel_requested"] == true
        {
            let mut ended = self.ended.lock().expect("ended");
            if ended.len() < 10_000 {
                ended.push((tenant.to_owned(), id.to_owned()));
            }
        }
    }
}

/// One client: until the chaos ends, a random request every 100–500 ms.
pub(super) async fn client(cs: Arc<Clients>, n: usize, mut rng: Rng) {
    for seq in 0..100_000u64 {
        if Instant::now() >= cs.until {
            return;
        }
        let tenant = rng.pick(&TENANTS).to_string();
        match rng.below(100) {
            0..68 => admit(&cs, &mut rng, tenant, format!("{:x}-{n}-{seq}", cs.seed)).await,
            68..80 => {
                if let Some((t, id)) = cs.cancel_target(&mut rng, &cs.journal) {
                    let path = format!("/api/executions/{id}/cancel");
                    let sent = now_ms();
                    let ans = cs.api.call(Method::POST, &path, Some(&t), None, None).await;
                    cs.record(
                        Op::Cancel {
                            tenant: t.clone(),
                            id: id.clone(),
                        },
                        sent,
                        &ans,
                    );
                    if ans.is_2xx() {
                        cs.note_status(&t, &id, ans.body());
                    }
                }
            }
            80..90 => {
                if let Some((t, id)) = cs.retry_target(&mut rng, &cs.journal) {
                    let path = format!("/api/executions/{id}/retry");
                    let sent = now_ms();
                    let ans = cs.api.call(Method::POST, &path, Some(&t), None, None).await;
                    cs.record(Op::Retry { id }, sent, &ans);
                }
            }
            90..96 => {
                if let Some((t, id)) = cs.any_known(&mut rng) {
                    let path = format!("/api/executions/{id}");
                    let ans = cs.api.call(Method::GET, &path, Some(&t), None, None).await;
                    if ans.status() == Some(200) {
                        cs.note_status(&t, &id, ans.body());
                    }
                }
            }
            _ => {
                let n = rng.between(1, 3);
                set_limit(&cs, &tenant, json!({ "max_concurrent": n }), n).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.between(100, 500))).await;
    }
}

/// One logical admission: a fresh nonce; with a key, retried (same key, same body) after a
/// transport error or a 5xx, at most 4 tries; without one, never retried.
async fn admit(cs: &Clients, rng: &mut Rng, tenant: String, nonce: String) {
    let fail_attempts = match rng.below(100) {
        0..15 => 1,
        15..20 => 2,
        _ => 0,
    };
    // Most runs are short; some outlive the lease several times, so they live on heartbeats
    // (renewed through Redis pauses, or lost) and a paused worker wakes up mid-run (a zombie).
    let ms = if rng.percent(15) {
        rng.between(1_000, 4_000)
    } else {
        rng.between(50, 400)
    };
    let max_attempts = rng.between(1, 4);
    let mut body = json!({
        "flow_id": FLOW,
        "params": {"ms": ms, "nonce": nonce, "fail_attempts": fail_attempts},
        "max_attempts": max_attempts,
    });
    // Some are prioritized, some scheduled a little later (the same on every try: a retried
    // request with a relative delay is a replay, and keeps the first admission's schedule).
    if rng.percent(40) {
        body["priority"] = json!(rng.between(1, 5));
    }
    let delay = rng.percent(25).then(|| rng.between(100, 1_500));
    if let Some(d) = delay {
        body["delay"] = json!(format!("{d}ms"));
    }
    // Most carry a concurrency key of a few (limit KEY_LIMIT each, property 10).
    if rng.percent(60) {
        body["concurrency_key"] = json!(format!("ck-{}", rng.below(3)));
    }
    let key = rng.percent(50).then(|| format!("key-{nonce}"));
    for try_no in 1..=4 {
        let sent = now_ms();
        let ans = cs
            .api
            .call(
                Method::POST,
                "/api/executions",
                Some(&tenant),
                key.as_deref(),
                Some(&body),
            )
            .await;
        let op = Op::Admit {
            tenant: tenant.clone(),
            nonce: nonce.clone(),
            key: key.clone(),
            try_no,
        };
        cs.record(op, sent, &ans);
        if let Some(id) = ans.execution_id() {
            let mut known = cs.known.lock().expect("known");
            if known.len() < 100_000 {
                known.push((tenant.clone(), id.to_owned()));
                let plan = Plan {
                    ms,
                    max_attempts,
                    delay,
                };
                cs.plans.lock().expect("plans").insert(id.to_owned(), plan);
            }
        }
        let unsure = ans.status().is_none_or(|s| s >= 500);
        let late = Instant::now() > cs.until + Duration::from_secs(3);
        if key.is_none() || !unsure || late {
            return;
        }
        tokio::time::sleep(Duration::from_millis(rng.between(100, 600))).await;
    }
}

/// `PUT /api/tenants/{t}` with `body`, recorded as a limit change to `max_concurrent`.
pub(super) async fn set_limit(
    cs: &Clients,
    tenant: &str,
    body: Value,
    max_concurrent: u64,
) -> Answer {
    let sent = now_ms();
    let path = format!("/api/tenants/{tenant}");
    let ans = cs
        .api
        .call(Method::PUT, &path, None, None, Some(&body))
        .await;
    let op = Op::Limit {
        tenant: tenant.to_owned(),
        max_concurrent,
    };
    cs.record(op, sent, &ans);
    ans
}
