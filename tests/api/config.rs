//! One typed configuration: flags, `SLUICE_*` variables and an optional TOML file, in that
//! order of precedence; `--help` explains every setting and never shows a secret.

use std::process::Command as Process;

use clap::CommandFactory;
use sluice::config::{Cli, Command};

use crate::helpers::sluice_bin;

fn serve_with_file(toml: &str, flags: &[&str]) -> Result<sluice::config::ServeArgs, clap::Error> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, toml).unwrap();
    let mut argv = vec![
        "sluice".to_owned(),
        "--config".to_owned(),
        path.display().to_string(),
        "serve".to_owned(),
    ];
    argv.extend(flags.iter().map(|f| f.to_string()));
    match Cli::load_from(argv)?.command {
        Command::Serve(args) => Ok(args),
        other => panic!("parsed {other:?}"),
    }
}

#[test]
fn the_config_file_fills_in_below_flags() {
    let args = serve_with_file(
        r#"
redis-url = "redis://10.1.2.3:6380"
body_limit = 4096
cors-origin = ["http://a.example", "http://b.example"]
data-dir = "/only/for/dev"

[serve]
request-timeout-ms = 2500
header-read-timeout-ms = 700

[dev]
redis-port = 7000
"#,
        &["--body-limit", "512"],
    )
    .unwrap();
    assert_eq!(args.redis.redis_url, "redis://10.1.2.3:6380");
    assert_eq!(args.api.body_limit, 512, "the flag wins over the file");
    assert_eq!(args.api.request_timeout_ms, 2500);
    assert_eq!(args.api.header_read_timeout_ms, 700);
    assert_eq!(
        args.api.cors_origins,
        vec!["http://a.example", "http://b.example"]
    );
    // Untouched settings keep their defaults.
    assert_eq!(args.api.default_max_attempts, 5);
    assert!(!args.api.dev_auth);
}

#[test]
fn unknown_settings_in_the_file_are_errors() {
    for toml in [
        "no-such-setting = 1",
        "[serve]\ndata-dir = \"x\"",
        "[nonsense]\nlisten = \"127.0.0.1:1\"",
        "body-limit = true",
        "dev-auth = \"yes\"",
    ] {
        assert!(serve_with_file(toml, &[]).is_err(), "{toml}");
    }
}

#[test]
fn every_setting_has_help_and_a_variable() {
    let cli = Cli::command();
    // Every command, also ones added later: a setting without help or variable is a bug.
    for sub in cli.get_subcommands() {
        let name = sub.get_name();
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if ["help", "version"].contains(&id) {
                continue;
            }
            assert!(arg.get_help().is_some(), "{name} --{id} has no help");
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env.as_deref().is_some_and(|e| e.starts_with("SLUICE_")),
                "{name} --{id} has no SLUICE_* variable"
            );
        }
    }
}

#[test]
fn help_explains_settings_and_hides_the_admin_token() {
    let out = Process::new(sluice_bin())
        .args(["serve", "--help"])
        .env("SLUICE_ADMIN_TOKEN", "very-secret-token-value")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--redis-url",
        "--admin-token",
        "--dev-auth",
        "--cors-origin",
        "--header-read-timeout-ms",
        "--config",
        "SLUICE_ADMIN_TOKEN",
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    assert!(!help.contains("very-secret-token-value"));

    let out = Process::new(sluice_bin()).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for word in ["serve", "dev", "openapi", "--config", "--log-format"] {
        assert!(help.contains(word), "{word} missing from --help");
    }
}

#[test]
fn a_printed_configuration_does_not_show_the_admin_token() {
    let cli = Cli::load_from([
        "sluice",
        "serve",
        "--admin-token",
        "very-secret-token-value",
    ])
    .unwrap();
    let Command::Serve(args) = &cli.command else {
        panic!("parsed {cli:?}");
    };
    assert_eq!(
        args.api.admin_token.as_ref().map(|s| s.expose()),
        Some("very-secret-token-value")
    );
    assert!(!format!("{cli:?}").contains("very-secret-token-value"));
}

/// Settings of a server on `redis`, as `sluice serve` would get them by default.
fn settings_on(redis: &crate::helpers::TestRedis) -> sluice::config::AppConfig {
    let mut api = sluice::config::ApiSettings::defaults();
    api.listen = "127.0.0.1:0".parse().unwrap();
    sluice::config::AppConfig {
        api,
        redis: redis.settings(),
    }
}

/// One tenant's waiters (each a connection) may not be most of the connection cap: the
/// defaults leave three quarters to others, and a configuration that gives one tenant more
/// than half is refused at start with an error naming both flags.
#[tokio::test]
async fn one_tenants_waiters_must_leave_most_connections_to_others() {
    let defaults = sluice::config::ApiSettings::defaults();
    assert_eq!(defaults.max_waiters_per_tenant, None);
    assert_eq!(defaults.waiters_per_tenant() * 4, defaults.max_connections);
    let redis = crate::helpers::TestRedis::start().await;
    let mut config = settings_on(&redis);
    config.api.max_connections = 200;
    config.api.max_waiters_per_tenant = Some(101);
    let err = sluice::Application::build(config.clone())
        .await
        .err()
        .expect("a tenant allowed more than half of the connections was accepted")
        .to_string();
    assert!(
        err.contains("--max-waiters-per-tenant") && err.contains("--max-connections"),
        "{err}"
    );
    config.api.max_waiters_per_tenant = Some(100);
    assert!(sluice::Application::build(config.clone()).await.is_ok());
    // Not set, it follows the cap: a quarter of it.
    config.api.max_waiters_per_tenant = None;
    assert_eq!(config.api.waiters_per_tenant(), 50);
    assert!(sluice::Application::build(config).await.is_ok());
}

/// The shares of connections: by default half of the cap for a key and for a tenant, each
/// following the other where only one is set. One that is set must let a tenant's long polls
/// reach the waiter cap (the rule that bounds them), fit in the cap, and a key's fit in its
/// tenant's; otherwise the server refuses to start, naming the flags. 0 turns a share off.
#[tokio::test]
async fn connection_shares_leave_room_for_the_waiter_cap_and_fit_their_tenants() {
    let defaults = sluice::config::ApiSettings::defaults();
    assert_eq!(defaults.max_connections, 1024);
    assert_eq!(defaults.connections_per_key(1024), 512);
    assert_eq!(defaults.connections_per_tenant(1024), 512);
    // On a cap lowered by the open-file limit, half of that.
    assert_eq!(defaults.connections_per_key(100), 50);
    let refused = |api: &sluice::config::ApiSettings| {
        api.check_connection_shares()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let mut api = defaults.clone();
    // Below the tenant's waiter cap (a quarter of the cap: 256).
    api.max_connections_per_key = Some(255);
    let err = refused(&api);
    assert!(
        err.contains("--max-connections-per-key (255)")
            && err.contains("--max-waiters-per-tenant (256)"),
        "{err}"
    );
    api.max_connections_per_key = Some(256);
    assert_eq!(refused(&api), "");
    // The tenant's share follows a key's set higher than half the cap...
    api.max_connections_per_key = Some(700);
    assert_eq!(refused(&api), "");
    assert_eq!(api.connections_per_tenant(1024), 700);
    // ...and a key's follows a tenant's set lower.
    api.max_connections_per_key = None;
    api.max_connections_per_tenant = Some(300);
    assert_eq!(api.connections_per_key(1024), 300);
    assert_eq!(refused(&api), "");
    // Both set: the key's may not exceed its tenant's.
    api.max_connections_per_key = Some(400);
    let err = refused(&api);
    assert!(
        err.contains("--max-connections-per-key (400)")
            && err.contains("--max-connections-per-tenant (300)"),
        "{err}"
    );
    // Past the cap means nothing.
    api.max_connections_per_key = None;
    api.max_connections_per_tenant = Some(2000);
    assert!(refused(&api).contains("--max-connections (1024)"));
    // 0: no share, whatever else is set.
    api.max_connections_per_tenant = Some(0);
    api.max_connections_per_key = Some(0);
    assert_eq!(refused(&api), "");
    assert_eq!(api.connections_per_key(1024), 0);
    assert_eq!(api.connections_per_tenant(1024), 0);
    // The server checks them at start.
    let redis = crate::helpers::TestRedis::start().await;
    let mut config = settings_on(&redis);
    config.api.max_connections_per_tenant = Some(10);
    let err = sluice::Application::build(config)
        .await
        .err()
        .expect("a tenant share under the waiter cap was accepted")
        .to_string();
    assert!(err.contains("--max-connections-per-tenant (10)"), "{err}");
}

/// `--cors-origin '*'` is refused at start with an error that says what to do (it used to
/// panic inside tower-http).
#[tokio::test]
async fn a_wildcard_cors_origin_is_a_clear_error() {
    let redis = crate::helpers::TestRedis::start().await;
    let mut config = settings_on(&redis);
    config.api.cors_origins = vec!["https://console.example".into(), "*".into()];
    let err = sluice::Application::build(config)
        .await
        .err()
        .expect("a wildcard origin was accepted")
        .to_string();
    assert!(err.contains("--cors-origin '*' is not supported"), "{err}");
}

#[test]
fn the_admission_group_is_between_one_and_a_hundred() {
    assert_eq!(
        serve_with_file("", &[])
            .unwrap()
            .redis
            .redis_admission_group,
        64
    );
    for ok in ["1", "100"] {
        let args = serve_with_file("", &["--redis-admission-group", ok]).unwrap();
        assert_eq!(args.redis.redis_admission_group.to_string(), ok);
    }
    for bad in ["0", "101", "many"] {
        let e = serve_with_file("", &["--redis-admission-group", bad]).unwrap_err();
        assert!(
            e.to_string().contains("--redis-admission-group"),
            "{bad}: {e}"
        );
    }
}
