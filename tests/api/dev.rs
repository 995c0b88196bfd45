//! `sluice dev`, the embedded default, driven as a user would: start it, admit and read an
//! execution with plain HTTP, stop it with SIGTERM, and find its redis-server gone.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::sluice_bin;

#[tokio::test]
async fn sluice_dev_runs_its_own_redis_and_serves_the_readme_curl() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(sluice_bin())
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The banner names the API address, then the Redis it started; read lines until both
    // appeared.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            for label in ["API", "Redis"] {
                if let Some(rest) = line.trim().strip_prefix(label) {
                    let first = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send((label, first.to_owned()));
                }
            }
        }
    });
    let banner = |want: &str| {
        let (label, value) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("sluice dev printed no {want} line"));
        assert_eq!(label, want);
        value
    };
    let api = banner("API");
    let redis_url = banner("Redis");
    // The redis-server it started: its process id, to check it is gone at the end.
    let redis_pid: u32 = {
        let mut c = redis::Client::open(redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no process_id in {info}"))
    };
    assert!(redis_is_alive(redis_pid));

    let client = sluice::tls::client_builder(&[]).unwrap().build().unwrap();
    let res = client
        .post(format!("{api}/executions"))
        .header("X-Tenant-Id", "acme")
        .header("Idempotency-Key", "order-42")
        .json(&json!({"flow_id": "demo.echo", "params": {"order": 42}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let created: Value = res.json().await.unwrap();
    let id = created["execution_id"].as_str().unwrap();
    let read = || async {
        client
            .get(format!("{api}/executions/{id}"))
            .header("X-Tenant-Id", "acme")
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let got = read().await;
    assert_eq!(got["params"], json!({"order": 42}));
    // The embedded worker runs demo.echo: queued → completed, with the params as output.
    let deadline = Instant::now() + Duration::from_secs(15);
    let done = loop {
        let e = read().await;
        if e["status"] == "completed" {
            break e;
        }
        assert!(Instant::now() < deadline, "not completed: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["output"], json!({"order": 42}));

    // SIGTERM: sluice stops and takes its redis-server down with it.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "sluice dev did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    // Its redis-server is gone with it: the process has exited (and was reaped), nothing
    // answers on its port, and it shut down cleanly (SHUTDOWN, which flushes the AOF) rather
    // than being killed.
    if redis_is_alive(redis_pid) {
        let _ = Command::new("kill").arg(redis_pid.to_string()).status();
        panic!("sluice dev exited and left its redis-server (pid {redis_pid}) running");
    }
    let port = redis_url.rsplit(':').next().unwrap();
    assert!(
        std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(),
        "something still answers on the dev redis port {port}"
    );
    let log = std::fs::read_to_string(data.path().canonicalize().unwrap().join("redis.log"))
        .expect("the dev redis-server logs in its data folder");
    assert!(log.contains("ready to exit, bye bye"), "{log}");
    // AOF on, in the data folder.
    let names: Vec<String> = walk(data.path());
    assert!(names.iter().any(|n| n.contains("appendonly")), "{names:?}");
}

/// Whether process `pid` exists and is not a zombie (Linux `/proc`).
fn redis_is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

#[test]
fn sluice_dev_says_clearly_when_redis_server_is_missing() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(sluice_bin())
        .args([
            "dev",
            "--redis-server",
            "/nonexistent/redis-server",
            "--data-dir",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("was not found"), "{stderr}");
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn dev_auth_refuses_a_network_address_unless_told_loudly() {
    let out = Command::new(sluice_bin())
        .args(["serve", "--dev-auth", "--listen", "0.0.0.0:0"])
        .args(["--redis-url", "redis://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--dangerously-allow-dev-auth-on-network"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("cannot use redis"),
        "checked before Redis: {stderr}"
    );
}

#[tokio::test]
async fn dev_auth_on_a_network_address_needs_the_override() {
    let redis = crate::helpers::TestRedis::start().await;
    let mut api = sluice::config::ApiSettings::defaults();
    api.dev_auth = true;
    api.listen = "0.0.0.0:0".parse().unwrap();
    let mut config = sluice::config::AppConfig {
        api,
        redis: redis.settings(),
    };
    let refused = sluice::Application::build(config.clone()).await;
    assert!(refused.is_err());
    config.api.dangerously_allow_dev_auth_on_network = true;
    assert!(sluice::Application::build(config.clone()).await.is_ok());
    // Loopback needs nothing.
    config.api.dangerously_allow_dev_auth_on_network = false;
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    assert!(sluice::Application::build(config).await.is_ok());
}
