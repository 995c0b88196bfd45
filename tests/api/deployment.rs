//! The deployment files agree with the program: `docker-compose.yml` runs Redis with AOF on a
//! volume, `sluice serve` and `sluice worker` with commands the CLI accepts, ports that match
//! the listen address, health checks, and the admin token from the environment. No Docker
//! engine runs here, so the file is parsed and checked instead of started.

use std::collections::BTreeSet;

use clap::CommandFactory;
use serde_json::Value;
use sluice::config::{Cli, Command};

fn manifest_file(name: &str) -> String {
    let path = format!("{}/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn compose() -> Value {
    serde_yaml_ng::from_str(&manifest_file("docker-compose.yml")).expect("compose file parses")
}

fn words(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("a command is a list of words")
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect()
}

/// Every `SLUICE_*` variable the CLI reads.
fn known_env_vars() -> BTreeSet<String> {
    let cli = Cli::command();
    let mut all: Vec<&clap::Command> = vec![&cli];
    all.extend(cli.get_subcommands());
    all.iter()
        .flat_map(|c| c.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn compose_runs_redis_with_aof_on_a_volume() {
    let c = compose();
    let services: BTreeSet<&str> = c["services"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(services, BTreeSet::from(["redis", "sluice", "worker"]));
    let redis = &c["services"]["redis"];
    let cmd = words(&redis["command"]);
    assert!(
        cmd.windows(2).any(|w| w == ["--appendonly", "yes"]),
        "{cmd:?}"
    );
    let volume = redis["volumes"][0].as_str().unwrap();
    let (name, mount) = volume.split_once(':').unwrap();
    assert_eq!(mount, "/data");
    assert!(
        c["volumes"].get(name).is_some(),
        "volume {name} not declared"
    );
    assert!(redis["healthcheck"]["test"].is_array());
}

#[test]
fn compose_serves_the_api_as_the_cli_understands_it() {
    let c = compose();
    let svc = &c["services"]["sluice"];
    let mut argv = vec!["sluice".to_owned()];
    argv.extend(words(&svc["command"]));
    let cli = Cli::try_parse_from_args(&argv);
    let Command::Serve(args) = cli.command else {
        panic!("the sluice service does not run `serve`: {argv:?}");
    };
    assert!(
        args.api.listen.ip().is_unspecified(),
        "listen on all interfaces in a container"
    );
    let port = args.api.listen.port();
    let ports: Vec<&str> = svc["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        ports.iter().any(|p| p.ends_with(&format!(":{port}"))),
        "{ports:?} do not publish {port}"
    );
    assert!(args.redis.redis_url.starts_with("redis://redis:"));
    let health = words(&svc["healthcheck"]["test"]).join(" ");
    assert!(
        health.contains(&format!("127.0.0.1:{port}/readyz")),
        "{health}"
    );
    assert_eq!(
        svc["depends_on"]["redis"]["condition"], "service_healthy",
        "the API waits for a healthy Redis"
    );
    // The admin token comes from the environment, never from the file.
    let token = svc["environment"]["SLUICE_ADMIN_TOKEN"].as_str().unwrap();
    assert!(token.starts_with("${SLUICE_ADMIN_TOKEN"), "{token}");
    assert!(
        !words(&svc["command"])
            .iter()
            .any(|w| w.contains("admin-token"))
    );
}

#[test]
fn compose_runs_a_worker_against_the_same_redis() {
    let c = compose();
    let svc = &c["services"]["worker"];
    let cmd = words(&svc["command"]);
    assert_eq!(cmd[0], "worker");
    assert!(
        cmd.windows(2)
            .any(|w| w == ["--redis-url", "redis://redis:6379"])
    );
    assert_eq!(svc["depends_on"]["redis"]["condition"], "service_healthy");
    // Checked against the CLI as soon as it has the `worker` command.
    if Cli::command().find_subcommand("worker").is_some() {
        let mut argv = vec!["sluice".to_owned()];
        argv.extend(cmd);
        Cli::try_parse_from_args(&argv);
    }
}

#[test]
fn compose_sets_only_variables_the_cli_reads() {
    let c = compose();
    let known = known_env_vars();
    for (name, svc) in c["services"].as_object().unwrap() {
        if name == "redis" {
            continue;
        }
        for var in svc["environment"].as_object().unwrap().keys() {
            assert!(known.contains(var), "{name}: {var} is read by nothing");
        }
        assert_eq!(svc["build"], ".", "{name} is built from the Dockerfile");
    }
}

#[test]
fn the_dockerfile_is_multi_stage_and_runs_sluice() {
    let d = manifest_file("Dockerfile");
    let stages = d.lines().filter(|l| l.starts_with("FROM ")).count();
    assert!(stages >= 2, "multi-stage build");
    assert!(d.contains("cargo build --release --locked"));
    assert!(d.contains(r#"ENTRYPOINT ["sluice"]"#));
    // The compose health check uses curl; the runtime image must have it.
    assert!(d.contains("curl"));
}

trait ParseArgs {
    fn try_parse_from_args(argv: &[String]) -> Cli;
}

impl ParseArgs for Cli {
    fn try_parse_from_args(argv: &[String]) -> Cli {
        <Cli as clap::Parser>::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{argv:?} is not a valid sluice command line: {e}"))
    }
}
