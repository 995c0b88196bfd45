//! The per-call overhead of a script: what one real call costs Redis beyond the commands it
//! runs. On a redis-server run by callgrind, `sluice serve` admits one execution, then, while
//! `MONITOR` records, the same request again (a replayed admission), and a pull worker leases
//! it, completes it and sends the same completion again (a repeated completion); markers
//! (`ECHO cost-mark:<step>`) cut the record into steps. Of each path the record gives the
//! script call (its command and every argument) and the commands it ran (`MONITOR` shows them
//! as client `lua`). `serve` is stopped; then, counted by callgrind with Redis's idle rate
//! taken out, the real call is sent `--cost-replays` times, and as often a bare script that
//! issues the same commands with the same arguments and nothing else, called with the same
//! keys and arguments (so parsing the call costs both the same). Overhead per call = (real −
//! bare) / replays: the script's own structure (helpers, tables, loops, string building).
//!
//! Without callgrind (a smoke run, no valgrind) the capture and both replays still run on a
//! plain redis-server and are checked, and the instruction figures are NOT RUN.
//!
//! Long on purpose: the capture, the `MONITOR` parser and the bare script that is built from
//! what it parsed belong together; the unit tests close the file.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::callgrind::Counted;
use super::{CostReport, Ctx, connect};
use crate::direct::padded_params;
use crate::harness::sluice_cmd;
use crate::load::{Conn, Workload};
use crate::procs::{self, Redis};
use crate::report::Check;
use crate::{ADMIN_TOKEN, UNLIMITED};

/// Calls per pipeline when replaying.
const PIPELINE: u64 = 50;

/// One path's overhead.
#[derive(Debug, Clone, Serialize)]
pub struct CallOverhead {
    /// `replayed admission`, `repeated completion`.
    pub path: String,
    /// The script called (its file, or its SHA1 when unknown; a function's name).
    pub script: String,
    /// Arguments of the call after the script (numkeys, keys, argv).
    pub call_args: usize,
    /// The commands the script ran, in order.
    pub commands: Vec<String>,
    pub replays: u64,
    /// Instructions per call: the real one, the bare one, the difference.
    pub call_ir: Option<f64>,
    pub bare_ir: Option<f64>,
    pub overhead_ir: Option<f64>,
    /// Instructions per call of the same operation composed as a script of its own (shebang,
    /// guard, only the helpers it reaches: how the build before the Functions library ran it,
    /// by EVALSHA) with the same keys and arguments; the library's gain is the difference.
    pub composed_ir: Option<f64>,
    /// Replies that were errors (real, bare, composed).
    pub reply_errors: (u64, u64, u64),
    /// Every command `serve` sent on the call's connection during the step (the call, and
    /// what it read besides: a replay's execution, read after the call since round two of the
    /// overhead work, and the forecast), by name, in order.
    pub step_commands: Vec<String>,
    /// Instructions per step when those commands are replayed together: what one such request
    /// costs Redis in all, so that work moved out of the script still counts.
    pub step_ir: Option<f64>,
}

/// Both paths, or why not.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overhead {
    /// Why the instruction figures were not counted (they are `None` then).
    pub not_run: Option<String>,
    pub paths: Vec<CallOverhead>,
}

/// The paths measured: their name, the steps (markers) around them, and what their script's
/// name contains.
const PATHS: [(&str, &str, &str, &str); 2] = [
    ("replayed admission", "replay", "lease", "admit"),
    ("repeated completion", "repeat", "end", "complete"),
];

pub(super) async fn measure(ctx: &Ctx<'_>, report: &mut CostReport) -> anyhow::Result<()> {
    let args = ctx.args;
    let mut out = Overhead::default();
    let mut counted = match &ctx.valgrind {
        Ok(vg) => Some(Counted::start(vg, ctx, "redis-callgrind-calls").await?),
        Err(why) => {
            out.not_run = Some(why.clone());
            None
        }
    };
    let plain = match counted {
        Some(_) => None,
        None => {
            Some(procs::start_redis_named(&args.redis_server, ctx.scratch, "redis-calls").await?)
        }
    };
    let redis: &Redis = match (&counted, &plain) {
        (Some(c), _) => &c.redis,
        (None, Some(p)) => p,
        (None, None) => unreachable!("one of the two was started"),
    };
    let url = redis.urls[0].clone();
    let addr = url.trim_start_matches("redis://").to_owned();
    let record = capture(ctx, redis, &addr).await?;
    let mut own = connect(&url).await?;
    let replays = args.cost_replays.max(1);
    for (path, from, to, script) in PATHS {
        let Some(mut call) = find_call(&record, from, to, script) else {
            report.checks.push(Check {
                phase: format!("per call: {path}"),
                ok: false,
                detail: format!("no call of a script named *{script}* was recorded"),
            });
            continue;
        };
        // The bare script issues what the call runs on this server now, which is not always
        // what it ran during its step: the steps after it change what it finds (the replayed
        // admission's mapping has left its bucket for the string key by the time the
        // completion is recorded, so each replay runs a GET its step did not).
        call.commands = match ran_now(&mut own, &addr, &call, script).await? {
            Some(now) => now,
            None => call.commands,
        };
        let bare = bare_script(&call);
        let bare_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&bare)
            .query_async(&mut own)
            .await?;
        let real_cmd = call.args.clone();
        let mut bare_cmd = call.args.clone();
        bare_cmd[0] = b"EVALSHA".to_vec();
        bare_cmd[1] = bare_sha.into_bytes();
        eprintln!("[cost] per call, {path}: {replays} replays, real and bare");
        let (real_ir, real_errors) =
            replay(&mut own, counted.as_mut(), &[real_cmd], replays).await?;
        let (bare_ir, bare_errors) =
            replay(&mut own, counted.as_mut(), &[bare_cmd], replays).await?;
        // The same operation as a script of its own (the two paths are shard operations),
        // loaded only after the bare script's replays and flushed after its own: a large
        // script in the scripts' Lua state makes every later script's allocations cost more
        // (its collector walks it), about 1,500 instructions a bare call here.
        let (composed_ir, composed_errors) = match sluice::store::operation(&call.script) {
            Some(op) => {
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(sluice::store::composed_source("shard", op))
                    .query_async(&mut own)
                    .await?;
                let mut cmd = call.args.clone();
                cmd[0] = b"EVALSHA".to_vec();
                cmd[1] = sha.into_bytes();
                let counted_composed = replay(&mut own, counted.as_mut(), &[cmd], replays).await?;
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut own)
                    .await?;
                counted_composed
            }
            None => (None, 0),
        };
        let (step_ir, step_errors) =
            replay(&mut own, counted.as_mut(), &call.step, replays).await?;
        let per = |ir: Option<f64>| ir.map(|v| (v / replays as f64).round());
        let (call_ir, bare_per, composed_per) = (per(real_ir), per(bare_ir), per(composed_ir));
        report.checks.push(Check {
            phase: format!("per call: {path}"),
            ok: bare_errors == 0 && composed_errors == real_errors && step_errors == real_errors,
            detail: format!(
                "{} replays of {} ({} commands): {real_errors} error replies; bare script: \
                 {bare_errors}; composed script: {composed_errors}; whole step: {step_errors}",
                replays,
                call.script,
                call.commands.len()
            ),
        });
        out.paths.push(CallOverhead {
            path: path.to_owned(),
            script: call.script.clone(),
            call_args: call.args.len() - 2,
            commands: call
                .commands
                .iter()
                .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_lowercase())
                .collect(),
            replays,
            call_ir,
            bare_ir: bare_per,
            overhead_ir: call_ir.zip(bare_per).map(|(a, b)| a - b),
            composed_ir: composed_per,
            reply_errors: (real_errors, bare_errors, composed_errors),
            step_commands: call
                .step
                .iter()
                .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_lowercase())
                .collect(),
            step_ir: per(step_ir),
        });
    }
    drop(own);
    match (counted, plain) {
        (Some(c), _) => c.shutdown().await?,
        (None, Some(p)) => p.kill().await,
        (None, None) => {}
    }
    report.overhead = Some(out);
    Ok(())
}

/// Sends the commands `cmds` (in order) `n` times (pipelines of 50 rounds), counted by
/// callgrind when given (Redis's idle rate over the same time taken out): the instructions and
/// the error replies.
async fn replay(
    conn: &mut MultiplexedConnection,
    counted: Option<&mut Counted>,
    cmds: &[Vec<Vec<u8>>],
    n: u64,
) -> anyhow::Result<(Option<f64>, u64)> {
    let send = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        let cmds = cmds.to_vec();
        async move {
            let mut errors = 0u64;
            let mut sent = 0;
            while sent < n {
                let batch = PIPELINE.min(n - sent);
                let mut p = redis::pipe();
                // Error replies come back as values, to be counted, not as the pipeline's error.
                p.ignore_errors();
                for _ in 0..batch {
                    for cmd in &cmds {
                        let mut c = redis::cmd(std::str::from_utf8(&cmd[0]).unwrap_or("EVALSHA"));
                        for a in &cmd[1..] {
                            c.arg(a.as_slice());
                        }
                        p.add_command(c);
                    }
                }
                let replies: Vec<redis::Value> = p.query_async(&mut conn).await?;
                errors += replies
                    .iter()
                    .filter(|v| matches!(v, redis::Value::ServerError(_)))
                    .count() as u64;
                sent += batch;
            }
            anyhow::Ok(errors)
        }
    };
    match counted {
        None => Ok((None, send(conn).await?)),
        Some(cg) => {
            let idle = cg.idle_rate(2.0).await?;
            let (errors, w) = cg.window(send(conn)).await?;
            Ok((Some(w.ir as f64 - idle * w.secs), errors))
        }
    }
}

/// The steps on `serve`, recorded by `MONITOR`; `serve` is stopped before this returns.
async fn capture(ctx: &Ctx<'_>, redis: &Redis, addr: &str) -> anyhow::Result<Vec<String>> {
    let args = ctx.args;
    let cmd = sluice_cmd(args, &ctx.program, redis.target());
    let slow = [
        "--redis-timeout-ms".to_owned(),
        "30000".to_owned(),
        "--request-timeout-ms".to_owned(),
        "100000".to_owned(),
    ];
    let (serve, http_addr) =
        procs::start_serve_with(&cmd, ctx.scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED, &slow)
            .await?;
    let mut own = connect(&redis.urls[0]).await?;
    let monitor = Recorder::start(addr).await?;
    let tenant = ctx.tenants[0].clone();
    let w = Workload {
        addr: http_addr,
        admin_token: ADMIN_TOKEN.into(),
        tenants: vec![tenant.clone()],
        tag: "calls".into(),
        flow: "demo.echo".into(),
        keys: 0,
        tokens: Vec::new(),
    };
    let mut http = Conn::connect(http_addr).await?;
    let (_, key, _) = w.request(0, 0);
    let body =
        serde_json::json!({"flow_id": "demo.echo", "params": padded_params(0, 30)}).to_string();
    let admit = |http: &Conn| w.post(http, &tenant, &key, body.clone());
    let req = admit(&http);
    let first = http.exchange(req).await?.0;
    anyhow::ensure!(first == 201, "the first admission answered {first}");
    mark(&mut own, "replay").await?;
    let req = admit(&http);
    let again = http.exchange(req).await?.0;
    anyhow::ensure!(again == 200, "the replayed admission answered {again}");
    mark(&mut own, "lease").await?;
    let lease = serde_json::json!({
        "worker_id": "cost", "max": 1, "tenants": [tenant], "lease": "30s",
    })
    .to_string();
    let (status, body) = http
        .call(
            hyper::Method::POST,
            "/api/worker/lease?wait=5s",
            ADMIN_TOKEN,
            &tenant,
            &lease,
        )
        .await?;
    anyhow::ensure!(status == 200, "the lease answered {status}");
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let run = answer["runs"]
        .get(0)
        .context("the lease gave no run")?
        .clone();
    let complete = serde_json::json!({
        "worker_id": "cost", "fence": run["fence"], "outcome": "completed",
        "output": run["params"],
    })
    .to_string();
    let path = format!(
        "/api/worker/runs/{}/complete",
        run["execution_id"].as_str().unwrap_or_default()
    );
    let done = http
        .call(hyper::Method::POST, &path, ADMIN_TOKEN, &tenant, &complete)
        .await?
        .0;
    anyhow::ensure!(done == 200, "the completion answered {done}");
    mark(&mut own, "repeat").await?;
    // Answered as the API answers a completion sent again; what counts is Redis's work.
    let _ = http
        .call(hyper::Method::POST, &path, ADMIN_TOKEN, &tenant, &complete)
        .await?;
    mark(&mut own, "end").await?;
    let lines = monitor.stop_after("cost-mark:end").await?;
    serve.kill().await;
    Ok(lines)
}

/// The commands `call` runs when sent once more now (recorded by `MONITOR` between two
/// markers), or `None` when the record shows no call of it.
async fn ran_now(
    own: &mut MultiplexedConnection,
    addr: &str,
    call: &Call,
    name: &str,
) -> anyhow::Result<Option<Vec<Vec<Vec<u8>>>>> {
    let monitor = Recorder::start(addr).await?;
    mark(own, "now").await?;
    let mut c = redis::cmd(std::str::from_utf8(&call.args[0]).unwrap_or("FCALL"));
    for a in &call.args[1..] {
        c.arg(a.as_slice());
    }
    // Its answer is not what is asked here (the replays count error replies).
    let _: redis::Value = c.query_async(own).await?;
    mark(own, "now-end").await?;
    let lines = monitor.stop_after("cost-mark:now-end").await?;
    Ok(find_call(&lines, "now", "now-end", name).map(|c| c.commands))
}

/// `ECHO cost-mark:<step>`: a line in the record between two steps.
async fn mark(own: &mut MultiplexedConnection, step: &str) -> anyhow::Result<()> {
    let _: String = redis::cmd("ECHO")
        .arg(format!("cost-mark:{step}"))
        .query_async(own)
        .await?;
    Ok(())
}

/// A `MONITOR` connection keeping every line.
struct Recorder {
    lines: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start(addr: &str) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("MONITOR connection to {addr}"))?;
        let (read, mut write) = stream.into_split();
        write.write_all(b"MONITOR\r\n").await?;
        let mut lines = BufReader::new(read).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("MONITOR did not answer")??;
        anyhow::ensure!(
            first.as_deref().map(str::trim_end) == Some("+OK"),
            "MONITOR answered {first:?}"
        );
        let kept: Arc<Mutex<Vec<String>>> = Arc::default();
        let k = kept.clone();
        let task = tokio::spawn(async move {
            let _write = write; // the connection stays open while the task runs
            while let Ok(Some(line)) = lines.next_line().await {
                k.lock().expect("monitor lines").push(line);
            }
        });
        Ok(Self { lines: kept, task })
    }

    /// Waits (at most 60 s) until a line contains `last`, then stops; every line.
    async fn stop_after(self, last: &str) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = self
                .lines
                .lock()
                .expect("monitor lines")
                .iter()
                .any(|l| l.contains(last));
            if seen {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "MONITOR never showed {last}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.task.abort();
        Ok(std::mem::take(
            &mut *self.lines.lock().expect("monitor lines"),
        ))
    }
}

/// A recorded script call: its command and arguments, the commands it ran, and every command
/// its client sent between the markers (the call among them).
#[derive(Debug, Clone, PartialEq)]
struct Call {
    script: String,
    args: Vec<Vec<u8>>,
    commands: Vec<Vec<Vec<u8>>>,
    step: Vec<Vec<Vec<u8>>>,
}

/// The first call, between the markers `from` and `to`, of a script whose name contains
/// `name` (an `EVALSHA` of a sluice script known by its SHA1, or an `FCALL` by its function).
fn find_call(lines: &[String], from: &str, to: &str, name: &str) -> Option<Call> {
    let parsed: Vec<(String, Vec<Vec<u8>>)> =
        lines.iter().filter_map(|l| parse_monitor(l)).collect();
    let is_mark = |args: &[Vec<u8>], step: &str| {
        args.len() == 2
            && args[0].eq_ignore_ascii_case(b"echo")
            && args[1] == format!("cost-mark:{step}").as_bytes()
    };
    let start = parsed.iter().position(|(_, a)| is_mark(a, from))?;
    let end = parsed.iter().position(|(_, a)| is_mark(a, to))?;
    let mut i = start + 1;
    while i < end {
        let (client, args) = &parsed[i];
        i += 1;
        if client == "lua" || args.len() < 3 {
            continue;
        }
        let verb = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        let script = match verb.as_str() {
            "evalsha" | "evalsha_ro" => script_name(&String::from_utf8_lossy(&args[1])),
            "fcall" | "fcall_ro" => function_file(&String::from_utf8_lossy(&args[1])),
            _ => continue,
        };
        if !script.contains(name) {
            continue;
        }
        let commands = parsed[i..end]
            .iter()
            .take_while(|(c, _)| c == "lua")
            .map(|(_, a)| a.clone())
            .collect();
        // The request's own commands, on whichever of serve's connections (a group commit's
        // call and a plain read go on different ones): the benchmark's own (its markers) and
        // serve's background work left out — another script's call (an orphan scan, a sweep),
        // blocking reads and subscriptions, PINGs, reads of keys that are not the request's.
        let own = &parsed[start].0;
        let step = parsed[start + 1..end]
            .iter()
            .filter(|(c, a)| c != "lua" && c != own && is_request_work(a, args))
            .map(|(_, a)| a.clone())
            .collect();
        return Some(Call {
            script,
            args: args.clone(),
            commands,
            step,
        });
    }
    None
}

/// Whether a command `serve` sent during a step is the request's own work, not background work
/// (see `find_call`); `call` is the step's script call.
fn is_request_work(args: &[Vec<u8>], call: &[Vec<u8>]) -> bool {
    let verb = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    let background = matches!(
        verb.as_str(),
        "ping"
            | "bzpopmin"
            | "bzpopmax"
            | "blpop"
            | "brpop"
            | "xread"
            | "xreadgroup"
            | "subscribe"
            | "psubscribe"
            | "unsubscribe"
            | "punsubscribe"
            | "client"
            | "info"
            | "hello"
            | "function"
            | "script"
    );
    let other_script = matches!(
        verb.as_str(),
        "evalsha" | "evalsha_ro" | "fcall" | "fcall_ro"
    ) && args != call;
    // A request reads its execution's row and its tenant's keys; serve's scans of a shard's
    // registries (SMEMBERS of its webhook set, ...) and the `{meta}`, `{acl}` data are others'.
    let request_key = args.get(1).is_some_and(|k| {
        let k = String::from_utf8_lossy(k);
        k.contains(":exec:") || k.contains(":t:")
    });
    args == call || (!background && !other_script && request_key)
}

/// The operation file of a function of this build's library (`sluice_<hash>_admit` →
/// `admit.lua`), else the function's name.
fn function_file(function: &str) -> String {
    function
        .strip_prefix(sluice::store::library_name())
        .and_then(|rest| rest.strip_prefix('_'))
        .map(|op| format!("{op}.lua"))
        .filter(|file| sluice::store::operation(file).is_some())
        .unwrap_or_else(|| function.to_owned())
}

/// The file of sluice's script with this SHA1 (as the store composes it), else the SHA1.
fn script_name(sha: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations-lua");
    let files = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok());
    for file in files {
        let Some(op) = sluice::store::operation(&file) else {
            continue;
        };
        for kind in ["shard", "acl", "meta"] {
            let source = sluice::store::composed_source(kind, op);
            if redis::Script::new(&source).get_hash() == sha {
                return file;
            }
        }
    }
    sha.to_owned()
}

/// A script that runs `call`'s commands with their arguments (as literals) and nothing else,
/// under the real script's shebang when it has one: the floor the real call is measured
/// against.
fn bare_script(call: &Call) -> String {
    let shebang = sluice::store::operation(&call.script)
        .and_then(|op| op.lines().next())
        .filter(|l| l.starts_with("#!"))
        .unwrap_or("#!lua");
    let mut s = format!("{shebang}\n");
    for c in &call.commands {
        let args: Vec<String> = c.iter().map(|a| lua_literal(a)).collect();
        s.push_str(&format!("redis.pcall({})\n", args.join(", ")));
    }
    s.push_str("return 0\n");
    s
}

/// A Lua string literal of `bytes`: printable ASCII as is, anything else as `\ddd`.
fn lua_literal(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() + 2);
    s.push('"');
    for &b in bytes {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\{b:03}"));
        }
    }
    s.push('"');
    s
}

/// `+1700000000.123 [0 127.0.0.1:5000] "EVALSHA" "ab.." "1" ...` → (client, arguments), the
/// arguments unescaped as Redis escaped them (`\"`, `\\`, `\n`, `\r`, `\t`, `\a`, `\b`,
/// `\xhh`).
fn parse_monitor(line: &str) -> Option<(String, Vec<Vec<u8>>)> {
    let rest = line.strip_prefix('+')?;
    let (_, rest) = rest.split_once('[')?;
    let (inside, rest) = rest.split_once(']')?;
    let client = inside.split_whitespace().nth(1)?.to_owned();
    let bytes = rest.as_bytes();
    let mut args = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut arg = Vec::new();
        while i < bytes.len() && bytes[i] != b'"' {
            if bytes[i] == b'\\' && i + 1 < bytes.len() {
                i += 1;
                match bytes[i] {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' if i + 2 < bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                        arg.push(u8::from_str_radix(hex, 16).ok()?);
                        i += 2;
                    }
                    other => arg.push(other),
                }
            } else {
                arg.push(bytes[i]);
            }
            i += 1;
        }
        i += 1; // the closing quote
        args.push(arg);
    }
    Some((client, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_unescape_as_redis_escaped_them() {
        let (client, args) =
            parse_monitor(r#"+1796549706.415096 [0 lua] "set" "a" "b\nx\"y\\z\x01""#).unwrap();
        assert_eq!(client, "lua");
        assert_eq!(
            args,
            vec![b"set".to_vec(), b"a".to_vec(), b"b\nx\"y\\z\x01".to_vec()]
        );
        assert_eq!(parse_monitor("+OK"), None);
    }

    #[test]
    fn a_call_is_found_between_its_markers_with_the_commands_it_ran() {
        let lines: Vec<String> = [
            r#"+1.0 [0 127.0.0.1:1] "fcall" "admit" "1" "k""#,
            r#"+1.1 [0 127.0.0.1:2] "echo" "cost-mark:replay""#,
            r#"+1.2 [0 127.0.0.1:1] "fcall" "reclaim" "1" "k""#,
            r#"+1.3 [0 lua] "zrange" "q" "0" "1""#,
            r#"+1.4 [0 127.0.0.1:1] "fcall" "admit" "1" "k" "v""#,
            r#"+1.5 [0 lua] "hget" "k" "f""#,
            r#"+1.6 [0 lua] "exists" "d""#,
            r#"+1.7 [0 127.0.0.1:1] "ping""#,
            r#"+1.71 [0 127.0.0.1:3] "get" "row""#,
            r#"+1.72 [0 127.0.0.1:4] "bzpopmin" "bell" "1""#,
            r#"+1.73 [0 127.0.0.1:4] "hgetall" "sluice:{meta}:pins""#,
            r#"+1.74 [0 127.0.0.1:4] "smembers" "sluice:{s01.2}:webhooks""#,
            r#"+1.75 [0 127.0.0.1:3] "zrank" "sluice:{s01.2}:t:acme:waiting" "x""#,
            r#"+1.8 [0 127.0.0.1:2] "echo" "cost-mark:lease""#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let call = find_call(&lines, "replay", "lease", "admit").unwrap();
        assert_eq!(call.script, "admit");
        assert_eq!(call.args.len(), 5);
        assert_eq!(
            call.commands,
            vec![
                vec![b"hget".to_vec(), b"k".to_vec(), b"f".to_vec()],
                vec![b"exists".to_vec(), b"d".to_vec()]
            ]
        );
        // The step: the call and what serve sent besides for the request, on any connection,
        // without its other work.
        assert_eq!(call.step.len(), 2);
        assert_eq!(call.step[0], call.args);
        assert_eq!(call.step[1][0], b"zrank".to_vec());
        assert!(find_call(&lines, "replay", "lease", "complete").is_none());
    }

    #[test]
    fn the_bare_script_runs_the_same_commands_as_literals() {
        let call = Call {
            script: "unknown".into(),
            args: Vec::new(),
            commands: vec![vec![b"hset".to_vec(), b"k".to_vec(), b"a\"\n\xff".to_vec()]],
            step: Vec::new(),
        };
        assert_eq!(
            bare_script(&call),
            "#!lua\nredis.pcall(\"hset\", \"k\", \"a\\034\\010\\255\")\nreturn 0\n"
        );
    }
}
