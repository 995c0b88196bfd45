//! Command line, environment and config file: every setting is a flag with a `SLUICE_*`
//! environment variable and a sane default, and may also come from a TOML file (`--config`);
//! precedence is flag, variable, file, default. Secrets (the admin token) are never printed or
//! logged (`--help` hides the variable's value).
//!
//! Long on purpose: every flag is declared here with its variable, default and help, the one home
//! of each default (`defaults_of`); splitting the flags by subsystem would scatter them again.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::ffi::OsString;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::store::{Layout, RedisTarget, ShardMap, StoreConfig};
use crate::worker::WorkerConfig;

/// sluice: execution admission on Redis — duplicates collapse to one execution, tenants stay
/// inside their quotas, and queued work is never mistaken for dead work.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, global = true, env = "SLUICE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// TOML file with settings (keys named like the flags, e.g. `redis-url = "..."`; a
    /// `[serve]` table applies to `serve` only). Flags and SLUICE_* variables win over it.
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// OpenTelemetry collector to export spans to over OTLP/HTTP (protobuf): its base URL,
    /// e.g. `http://127.0.0.1:4318` (spans go to `<url>/v1/traces`). `serve` exports `admit`,
    /// `worker` exports `wait`, `start`, `run` and `complete`. Unset: no spans are made.
    #[arg(long, global = true, env = "SLUICE_OTLP_ENDPOINT", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
}

/// An `--otlp-endpoint`: an `http://` or `https://` URL.
fn otlp_endpoint(s: &str) -> Result<String, String> {
    if (s.starts_with("http://") || s.starts_with("https://")) && s.len() > "https://".len() {
        Ok(s.to_owned())
    } else {
        Err("must be an http:// or https:// URL, e.g. http://127.0.0.1:4318".into())
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// What to run.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API and the sweeper against an existing Redis (production).
    Serve(ServeArgs),
    /// Run flows: read dispatched executions, run them under heartbeated leases, recover
    /// orphans.
    Worker(WorkerArgs),
    /// Run everything locally: a managed redis-server (data in a local folder, AOF on), the
    /// API in dev-auth mode and a worker with the demo flows. For trying sluice out, never for
    /// production.
    Dev(DevArgs),
    /// Print the OpenAPI document (the one committed as openapi/openapi.json).
    Openapi,
    /// Move data written with an older key layout to the current one (stop or expect 503s
    /// from running sluice processes until they are restarted; see docs/operations.md, Upgrades).
    MigrateLayout {
        #[command(flatten)]
        redis: RedisSettings,
    },
    /// Operate on the Redis Cluster sluice runs on: see where shards live, move one.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

/// `sluice cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// List every shard with its hash slot, its master and whether it is frozen.
    Shards {
        #[command(flatten)]
        redis: RedisSettings,
    },
    /// Move a shard (its one hash slot) to another master, losing nothing: the shard is frozen
    /// (its calls answer 503, retryable) while its keys are copied, then served by the new
    /// master. Run it again to finish a move that was interrupted.
    MoveShard {
        /// The shard's number (see `sluice cluster shards`).
        #[arg(long)]
        shard: u16,
        /// The master to move it to: `host:port` as the cluster names it, or its node id.
        #[arg(long)]
        to: String,
        /// Keys copied per MIGRATE call (each call blocks the source node while it runs).
        #[arg(long, default_value_t = 100)]
        keys_per_call: usize,
        #[command(flatten)]
        redis: RedisSettings,
    },
}

/// `sluice serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub api: ApiSettings,
    #[command(flatten)]
    pub redis: RedisSettings,
}

/// `sluice worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub redis: RedisSettings,
    #[command(flatten)]
    pub worker: WorkerSettings,
}

/// Settings of the worker runtime.
#[derive(Debug, Clone, Args)]
pub struct WorkerSettings {
    /// Flows file (TOML) mapping flow names to `http` or `command` handlers.
    #[arg(long, env = "SLUICE_FLOWS")]
    pub flows: Option<PathBuf>,
    /// Also run the built-in demo flows (demo.echo, demo.sleep, demo.fail, demo.panic,
    /// demo.journal).
    #[arg(long, env = "SLUICE_DEMO_FLOWS")]
    pub demo_flows: bool,
    /// Executions run at once by this worker.
    #[arg(long, env = "SLUICE_CONCURRENCY", default_value_t = WorkerConfig::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Lease length without a heartbeat, in milliseconds.
    #[arg(long, env = "SLUICE_LEASE_TTL_MS", default_value_t = millis(WorkerConfig::DEFAULT_LEASE_TTL))]
    pub lease_ttl_ms: u64,
    /// Heartbeat interval, in milliseconds (well under the lease TTL).
    #[arg(long, env = "SLUICE_HEARTBEAT_MS", default_value_t = millis(WorkerConfig::DEFAULT_HEARTBEAT))]
    pub heartbeat_ms: u64,
    /// Orphan scan interval, in milliseconds: each shard's one periodic call, which is also
    /// the safety poll for wake-ups that were lost (workers are woken by Redis, not polling).
    #[arg(long, env = "SLUICE_SCAN_MS", default_value_t = millis(WorkerConfig::DEFAULT_SCAN))]
    pub scan_ms: u64,
    /// On SIGTERM/SIGINT, how long running executions may finish before their leases are
    /// released to other workers, in milliseconds.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT_MS", default_value_t = millis(WorkerConfig::DEFAULT_DRAIN_TIMEOUT))]
    pub drain_timeout_ms: u64,
    /// Backoff before retrying a retryable failure, in milliseconds; doubles per attempt.
    #[arg(long, env = "SLUICE_RETRY_BACKOFF_MS", default_value_t = millis(WorkerConfig::DEFAULT_RETRY_BACKOFF))]
    pub retry_backoff_ms: u64,
    /// Cap of the retry backoff, in milliseconds.
    #[arg(long, env = "SLUICE_RETRY_BACKOFF_MAX_MS", default_value_t = millis(WorkerConfig::DEFAULT_RETRY_BACKOFF_MAX))]
    pub retry_backoff_max_ms: u64,
}

/// A default duration as the whole milliseconds its flag takes.
const fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl WorkerSettings {
    /// The runtime's configuration (with a fresh consumer name).
    pub fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            concurrency: self.concurrency.max(1),
            lease_ttl: Duration::from_millis(self.lease_ttl_ms),
            heartbeat_interval: Duration::from_millis(self.heartbeat_ms.max(1)),
            scan_interval: Duration::from_millis(self.scan_ms.max(1)),
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            retry_backoff: Duration::from_millis(self.retry_backoff_ms),
            retry_backoff_max: Duration::from_millis(self.retry_backoff_max_ms),
            consumer: crate::worker::default_consumer(),
        }
    }

    /// The flows this worker runs: the flows file's, plus the demo flows when asked.
    pub fn registry(&self) -> anyhow::Result<crate::worker::Registry> {
        let mut r = crate::worker::Registry::new();
        if self.demo_flows {
            r = crate::worker::with_demo_flows(r);
        }
        if let Some(path) = &self.flows {
            r = crate::worker::load_flows(r, path)?;
        }
        Ok(r)
    }

    /// The defaults, as `sluice worker` with no flag, variable or file would have them.
    pub fn defaults() -> Self {
        defaults_of()
    }
}

/// `sluice dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub api: ApiSettings,
    /// Executions the embedded worker runs at once.
    #[arg(
        long = "worker-concurrency",
        env = "SLUICE_CONCURRENCY",
        default_value_t = WorkerConfig::DEFAULT_CONCURRENCY
    )]
    pub worker_concurrency: usize,
    /// Flows file for the embedded worker (the demo flows are always on in dev).
    #[arg(long, env = "SLUICE_FLOWS")]
    pub flows: Option<PathBuf>,
    /// Folder for the managed redis-server's data (AOF and RDB files).
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = ".sluice-dev")]
    pub data_dir: PathBuf,
    /// The redis-server program to start.
    #[arg(long, env = "SLUICE_REDIS_SERVER", default_value = "redis-server")]
    pub redis_server: PathBuf,
    /// Port for the managed redis-server; 0 picks a free one.
    #[arg(long, env = "SLUICE_DEV_REDIS_PORT", default_value_t = 0)]
    pub redis_port: u16,
    /// Shard count recorded at first start.
    #[arg(long, env = "SLUICE_SHARDS", default_value_t = ShardMap::DEFAULT_SHARDS)]
    pub shards: u16,
    /// Start a local three-master Redis Cluster (in `--data-dir`, ports chosen at its first
    /// start) instead of one redis-server.
    #[arg(long, env = "SLUICE_DEV_CLUSTER")]
    pub cluster: bool,
    /// Test and benchmark switch until key layout 5 is `CURRENT` (so hidden): the key layout
    /// (4 or 5) a Redis with no meta record yet records at this first start. A Redis that
    /// records one already keeps it: nothing is converted by this flag (`sluice
    /// migrate-layout` still targets 4).
    #[arg(long, env = "SLUICE_INITIAL_LAYOUT", hide = true,
        value_parser = clap::value_parser!(u32).range(4..=5))]
    pub initial_layout: Option<u32>,
}

/// Settings of the HTTP API and of admission.
#[derive(Debug, Clone, Args)]
pub struct ApiSettings {
    /// Address to listen on.
    #[arg(long, env = "SLUICE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Platform admin token (Bearer); may act for any tenant with X-Tenant-Id.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,
    /// Dev mode: no token needed, the tenant comes from X-Tenant-Id and the caller is platform
    /// admin. Unsafe anywhere but a developer's machine.
    #[arg(long, env = "SLUICE_DEV_AUTH")]
    pub dev_auth: bool,
    /// Upper bound on handling one request, in milliseconds; must exceed three times
    /// --redis-timeout-ms (an admission may make three Redis calls).
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_MS", default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SLUICE_BODY_LIMIT", default_value_t = 1024 * 1024)]
    pub body_limit: usize,
    /// Largest accepted body of a batch admission (`POST /api/executions/batch`, up to 1,000
    /// executions), in bytes.
    #[arg(long, env = "SLUICE_BATCH_BODY_LIMIT", default_value_t = 16 * 1024 * 1024)]
    pub batch_body_limit: usize,
    /// Memory the batch admissions being processed on this server may hold at once, in
    /// bytes. Each batch reserves, before its body is read, its `Content-Length` plus 2 KiB
    /// for each item it could hold (at most 1,000), and holds what its items keep until its
    /// answer is written; a batch that does not fit is answered 429 `batch_memory_full`
    /// (nothing read or admitted). Default: four full batches, 4 × (--batch-body-limit + 2,000
    /// KiB); at least one.
    #[arg(long, env = "SLUICE_BATCH_MEMORY_LIMIT")]
    pub batch_memory_limit: Option<usize>,
    /// How long a connection may take to deliver a request's headers, in milliseconds,
    /// counted from its accept and from the end of its previous answer (HTTP/1 and HTTP/2): a
    /// client slower than this (slowloris), silent, or idle that long is disconnected.
    #[arg(long, env = "SLUICE_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// Connections open at once on each listener; more are answered 503 and closed at once.
    /// Keep it well under the process's open-file limit (`ulimit -n`), which the server
    /// raises to its hard limit at start and then checks this against.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Age of a connection, in milliseconds, after which it is closed once no request is in
    /// flight on it (HTTP/1: `Connection: close` on the next answer; HTTP/2: GOAWAY). A long
    /// poll or event stream in flight is not cut; the client simply reconnects afterwards. So
    /// no client keeps a connection for ever by sending a cheap request every few seconds.
    #[arg(long, env = "SLUICE_MAX_CONNECTION_AGE_MS", default_value_t = 300_000)]
    pub max_connection_age_ms: u64,
    /// Connections one client address may hold that have not yet carried an authenticated
    /// request (0 = no cap). One accepted beyond them must authenticate: a request on it that
    /// does not is answered 503 `too_many_connections` and the connection closed, and a
    /// silent one is closed after 2 s. A connection stops counting with its first
    /// authenticated request, so many authenticated clients behind one address (workers
    /// behind a NAT) still fit. Raise it (or 0) behind a reverse proxy that serves many
    /// anonymous browsers from one address.
    #[arg(
        long,
        env = "SLUICE_MAX_ANONYMOUS_CONNECTIONS_PER_ADDRESS",
        default_value_t = 64
    )]
    pub max_anonymous_connections_per_address: usize,
    /// Connections one API key may hold on a listener. A connection counts against the key of
    /// the first request that authenticated on it until it closes (later requests on it, with
    /// any credential, are served and counted nowhere else); a request that would take one
    /// more is answered 429 `key_too_many_connections` before anything is done for it, and
    /// its connection closed. The platform admin token counts against no share. Default: half
    /// of --max-connections (512 of 1024), or --max-connections-per-tenant where that is
    /// lower. At least --max-waiters-per-tenant (checked at start), so a key's long polls meet
    /// the waiter cap first. 0 = no such share (e.g. behind a proxy whose pooled connections
    /// carry many clients' requests).
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_KEY")]
    pub max_connections_per_key: Option<usize>,
    /// Connections one tenant's API keys (and, under --dev-auth, requests naming the tenant)
    /// may hold together on a listener, counted like --max-connections-per-key; one more is
    /// answered 429 `tenant_too_many_connections` and closed. A tenant admin can mint many
    /// keys: this keeps them from adding up to every connection. Default: half of
    /// --max-connections (512 of 1024), or --max-connections-per-key where that is higher. At
    /// least --max-waiters-per-tenant and --max-connections-per-key (checked at start); 0 =
    /// no such share.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_TENANT")]
    pub max_connections_per_tenant: Option<usize>,
    /// Largest `params` of an execution, in bytes of canonical JSON (413 `params_too_large`).
    #[arg(long, env = "SLUICE_MAX_PARAMS_BYTES", default_value_t = 64 * 1024)]
    pub max_params_bytes: usize,
    /// Byte budget of one listing page (executions' rows as stored): a page that would exceed
    /// it ends early and still returns a cursor. Bounds what one listing request holds.
    #[arg(long, env = "SLUICE_MAX_PAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_page_bytes: usize,
    /// Lookups per second, per server, of API keys whose id this server does not know to
    /// exist (it reads the ids that exist at start and hears each creation): made-up tokens
    /// cost Redis at most this, with a burst of 10 s of it; past it such a token is answered
    /// 503 `key_lookups_busy`.
    #[arg(
        long,
        env = "SLUICE_UNKNOWN_KEY_LOOKUPS_PER_SECOND",
        default_value_t = 100
    )]
    pub unknown_key_lookups_per_second: u32,
    /// Live API keys one tenant may have; creating more answers 409 `too_many_api_keys`
    /// (revoke one first). Keeps a tenant's key list, which is read whole, bounded.
    #[arg(long, env = "SLUICE_MAX_API_KEYS_PER_TENANT", default_value_t = 100)]
    pub max_api_keys_per_tenant: usize,
    /// Bearer token that `/metrics` requires (Prometheus: `authorization: {credentials_file:
    /// ...}`). On --listen, without this token (or --metrics-open) `/metrics` answers 401 to
    /// everybody: it names every tenant with its counts.
    #[arg(long, env = "SLUICE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<Secret>,
    /// Serve `/metrics` on this address only (e.g. an internal interface), not on --listen.
    /// There it needs no token unless --metrics-token is set: who reaches that address is the
    /// operator's choice.
    #[arg(long, env = "SLUICE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve `/metrics` on --listen to anyone, without a token (a server only a trusted
    /// network reaches). Off by default: `/metrics` names every tenant with its counts.
    #[arg(long, env = "SLUICE_METRICS_OPEN")]
    pub metrics_open: bool,
    /// Tenants with a `tenant` label of their own in `/metrics`; admissions of further tenants
    /// are counted under `tenant="_other"`, so the series stay bounded.
    #[arg(long, env = "SLUICE_METRICS_TENANT_LIMIT", default_value_t = 1000)]
    pub metrics_tenant_limit: usize,
    /// Allow --dev-auth on a listen address other than loopback. Dev auth checks no
    /// credentials: with this, anyone who reaches the port is platform admin.
    #[arg(long, env = "SLUICE_DANGEROUSLY_ALLOW_DEV_AUTH_ON_NETWORK")]
    pub dangerously_allow_dev_auth_on_network: bool,
    /// Browser origin allowed to call the API (CORS), e.g. `https://console.example.com`;
    /// repeat the flag or separate with commas. None by default: no CORS headers are sent.
    #[arg(
        long = "cors-origin",
        env = "SLUICE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Concurrency limit of tenants without their own.
    #[arg(long, env = "SLUICE_DEFAULT_MAX_CONCURRENT", default_value_t = 100)]
    pub default_max_concurrent: u32,
    /// Waiting-set limit of tenants without their own.
    #[arg(long, env = "SLUICE_DEFAULT_MAX_QUEUED", default_value_t = 100_000)]
    pub default_max_queued: u32,
    /// max_attempts of executions that do not say.
    #[arg(long, env = "SLUICE_DEFAULT_MAX_ATTEMPTS", default_value_t = 5)]
    pub default_max_attempts: u32,
    /// Logical bytes a tenant without its own `max_bytes` may keep: its queued, running and
    /// retained terminal executions, each counted as 512 + its params + its output + its error
    /// message. An admission over it answers 429 `tenant_storage_full` (413
    /// `execution_too_large` if it alone is larger).
    #[arg(long, env = "SLUICE_DEFAULT_MAX_BYTES", default_value_t = 1 << 30)]
    pub default_max_bytes: u64,
    /// Terminal executions a tenant without its own `max_retained` may keep (until they
    /// expire after the retention); at the bound its admissions answer 429
    /// `tenant_storage_full`.
    #[arg(long, env = "SLUICE_DEFAULT_MAX_RETAINED", default_value_t = 1_000_000)]
    pub default_max_retained: u64,
    /// How long terminal executions stay readable, in days.
    #[arg(long, env = "SLUICE_RETENTION_DAYS", default_value_t = 30)]
    pub retention_days: u64,
    /// How long terminal executions stay readable, in seconds, in place of --retention-days
    /// (short-lived deployments, demos and tests).
    #[arg(long, env = "SLUICE_RETENTION_SECS")]
    pub retention_secs: Option<u64>,
    /// How long a dedup key keeps mapping to its execution after that became terminal, in
    /// hours (while it is queued or running the mapping never expires).
    #[arg(long, env = "SLUICE_DEDUP_TTL_HOURS", default_value_t = 7 * 24)]
    pub dedup_ttl_hours: u64,
    /// How often the sweeper repairs slot sets and indexes, in seconds (0 = never). One
    /// `serve` process sweeps at a time.
    #[arg(long, env = "SLUICE_SWEEP_INTERVAL_SECS", default_value_t = 60)]
    pub sweep_interval_secs: u64,
    /// Most records each shard's dead-letter stream keeps in all. When it is hit, the tenant
    /// holding the most records in the shard loses its oldest; every eviction is counted.
    #[arg(long, env = "SLUICE_DLQ_CAP", default_value_t = 10_000)]
    pub dlq_cap: u64,
    /// Most dead-letter records one tenant keeps (in its shard); beyond it the tenant's own
    /// oldest are evicted and counted, so one tenant's flood of failures pushes out no other
    /// tenant's records. At most --dlq-cap (a larger value acts as --dlq-cap).
    #[arg(long, env = "SLUICE_DLQ_TENANT_CAP", default_value_t = 1_000)]
    pub dlq_tenant_cap: u64,
    /// Keep each shard's start log (`<prefix>starts`: tenant, virtual start tag and weight of
    /// every start, about the last 10,000), which proves the fair share (the dispatch tests, the
    /// fault suite's checker and the fairness benchmark read it). Off by default: nothing in
    /// sluice reads it, and it costs every start a stream write and each shard about 10,000
    /// entries of memory. Published to Redis for `sluice worker`s to follow, like the other
    /// data policy (a worker reads it at start and every minute).
    #[arg(long, env = "SLUICE_START_LOG")]
    pub start_log: bool,
    /// How often this server looks for expired leases (of pull workers, and of any worker
    /// that died) in each shard, in milliseconds (0 = never: leave it to `sluice worker`s).
    #[arg(long, env = "SLUICE_ORPHAN_SCAN_MS", default_value_t = 5_000)]
    pub orphan_scan_ms: u64,
    /// Pull workers' failed runs that may be retried wait this long before their 2nd attempt,
    /// in milliseconds, doubling per attempt (as `sluice worker --retry-backoff-ms`).
    #[arg(long, env = "SLUICE_RETRY_BACKOFF_MS", default_value_t = 1_000)]
    pub retry_backoff_ms: u64,
    /// The cap of that backoff, in milliseconds.
    #[arg(long, env = "SLUICE_RETRY_BACKOFF_MAX_MS", default_value_t = 300_000)]
    pub retry_backoff_max_ms: u64,
    /// Pull workers' stop mailboxes (cancels kept for a worker's next stop poll, by
    /// `worker_id`) one credential may have on this server; past it, its own mailbox idle the
    /// longest is forgotten. A worker id is made up by its caller: this bounds what one key
    /// inventing ids can hold.
    #[arg(
        long,
        env = "SLUICE_PULL_MAILBOXES_PER_CREDENTIAL",
        default_value_t = 1024
    )]
    pub pull_mailboxes_per_credential: usize,
    /// Stop mailboxes this server keeps in all; past it, the idle-longest mailbox of the
    /// credential holding the most is forgotten.
    #[arg(long, env = "SLUICE_PULL_MAILBOXES", default_value_t = 16_384)]
    pub pull_mailboxes: usize,
    /// Whether this server delivers tenants' webhooks (`PUT /api/tenants/{t}/webhook`). Any
    /// number of servers may: one at a time delivers a given tenant.
    #[arg(long, env = "SLUICE_WEBHOOK_DELIVERY", default_value_t = true, action = clap::ArgAction::Set)]
    pub webhook_delivery: bool,
    /// Let webhooks reach loopback, private, link-local and other non-public addresses
    /// (refused by default: a tenant's address could otherwise reach the server's own
    /// network, e.g. a cloud metadata service).
    #[arg(long, env = "SLUICE_WEBHOOK_ALLOW_PRIVATE")]
    pub webhook_allow_private: bool,
    /// PEM file of root certificates to trust for `https` webhook receivers besides the
    /// built-in ones (the Mozilla root program's): a closed network's private CA. Read at start; a file that cannot be read
    /// or holds no certificate stops the server.
    #[arg(long, env = "SLUICE_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: Option<std::path::PathBuf>,
    /// How long one webhook delivery may take, connection included, in milliseconds.
    #[arg(long, env = "SLUICE_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    pub webhook_timeout_ms: u64,
    /// How often every shard's webhook tenants are looked at for events left behind (a
    /// server stopped mid-delivery, a wake-up lost), in milliseconds (0 = only at start and
    /// after the wake-up listener reconnects).
    #[arg(long, env = "SLUICE_WEBHOOK_SCAN_MS", default_value_t = 30_000)]
    pub webhook_scan_ms: u64,
    /// Webhook events not delivered within this many seconds are dropped (and counted).
    #[arg(long, env = "SLUICE_WEBHOOK_MAX_AGE_SECS", default_value_t = 3 * 86_400)]
    pub webhook_max_age_secs: u64,
    /// Clients waiting at once on this server, long polls (`GET /api/executions/{id}?wait=`)
    /// and event streams (`/events`) together; more are answered 503 `too_many_waiters`.
    #[arg(long, env = "SLUICE_MAX_WAITERS", default_value_t = 10_000)]
    pub max_waiters: usize,
    /// Of those, how many one tenant may hold; more are answered 429
    /// `tenant_too_many_waiters` (and the connection is closed). Each waiter holds a
    /// connection, so this must be at most half of --max-connections (checked at start): one
    /// tenant's keys can never take most of the server's connections. Default: a quarter of
    /// --max-connections (256 of 1024).
    #[arg(long, env = "SLUICE_MAX_WAITERS_PER_TENANT")]
    pub max_waiters_per_tenant: Option<usize>,
    /// How long an event stream lasts, in seconds; the client then opens it again (and gets
    /// the current state first). Keeps an execution that stays queued from holding a waiter
    /// forever.
    #[arg(long, env = "SLUICE_EVENTS_LIFETIME_SECS", default_value_t = 300)]
    pub events_lifetime_secs: u64,
    /// Silence after which an event stream sends a heartbeat (a comment line), in
    /// milliseconds; at most half of --request-timeout-ms plus --header-read-timeout-ms (the
    /// silence after which a connection counts as stalled), and lowered to that.
    #[arg(long, env = "SLUICE_EVENTS_HEARTBEAT_MS", default_value_t = 15_000)]
    pub events_heartbeat_ms: u64,
}

/// A secret setting (the admin token): parsed like any string, but its `Debug` never shows
/// the value, so a logged or printed configuration cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where Redis is and how to talk to it.
#[derive(Debug, Clone, Args)]
pub struct RedisSettings {
    /// Redis URL.
    #[arg(
        long,
        env = "SLUICE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Redis Cluster seed nodes, comma-separated (e.g.
    /// `redis://10.0.0.1:6379,redis://10.0.0.2:6379`): any reachable one is enough, the rest of
    /// the cluster is discovered. When given, sluice runs on that cluster and `--redis-url` is
    /// not used.
    #[arg(
        long,
        env = "SLUICE_REDIS_CLUSTER",
        value_delimiter = ',',
        num_args = 1..,
        conflicts_with = "redis_url"
    )]
    pub redis_cluster: Vec<String>,
    /// Multiplexed Redis connections this process spreads its calls over. Each pipelines many
    /// calls; fewer connections mean larger batches per write and read on Redis (faster), more
    /// spread the client-side work of a many-core server.
    #[arg(long, env = "SLUICE_REDIS_CONNECTIONS", default_value_t = 2)]
    pub redis_connections: usize,
    /// Most admissions one admission call to a shard carries (group commit: while a shard's
    /// call is in flight, the admissions that arrive for it wait and go together in its next
    /// call; no timer, a lone request goes at once). 1 sends every admission alone.
    #[arg(long, env = "SLUICE_REDIS_ADMISSION_GROUP", default_value_t = 64,
        value_parser = clap::value_parser!(u16).range(1..=100))]
    pub redis_admission_group: u16,
    /// Upper bound on one Redis operation (connecting included), in milliseconds.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT_MS", default_value_t = 2_000)]
    pub redis_timeout_ms: u64,
    /// Replicas that must hold a script's writes before its answer counts (WAIT after every
    /// script call, bounded by a quarter of --redis-timeout-ms), so an acknowledged write
    /// survives its master's crash and failover. 0 (default): asynchronous replication, as
    /// Redis does it. When fewer replicas acknowledge in time the answer is given anyway and a
    /// warning logged (use Redis's `min-replicas-to-write` to refuse writes instead).
    #[arg(long, env = "SLUICE_REDIS_REPLICA_ACKS", default_value_t = 0)]
    pub redis_replica_acks: u32,
    /// Shard count recorded at first start (later starts use the recorded one).
    #[arg(long, env = "SLUICE_SHARDS", default_value_t = ShardMap::DEFAULT_SHARDS)]
    pub shards: u16,
    /// Shards kept for tenants pinned to a shard of their own, recorded at first start (see
    /// `POST /api/tenants/{tenant}/dedicated-shard`).
    #[arg(long, env = "SLUICE_DEDICATED_SHARDS", default_value_t = ShardMap::DEFAULT_DEDICATED)]
    pub dedicated_shards: u16,
    /// Test and benchmark switch until key layout 5 is `CURRENT` (so hidden): the key layout
    /// (4 or 5) a Redis with no meta record yet records at this first start. A Redis that
    /// records one already keeps it: nothing is converted by this flag (`sluice
    /// migrate-layout` still targets 4).
    #[arg(long, env = "SLUICE_INITIAL_LAYOUT", hide = true,
        value_parser = clap::value_parser!(u32).range(4..=5))]
    pub initial_layout: Option<u32>,
}

impl ApiSettings {
    /// The defaults, as `sluice serve` with no flag, variable or file would have them.
    pub fn defaults() -> Self {
        defaults_of()
    }

    /// `--request-timeout-ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// `--max-connection-age-ms` as a duration.
    pub fn max_connection_age(&self) -> Duration {
        Duration::from_millis(self.max_connection_age_ms)
    }

    /// `--max-waiters-per-tenant`, or a quarter of `--max-connections` when not set.
    pub fn waiters_per_tenant(&self) -> usize {
        self.max_waiters_per_tenant
            .unwrap_or(self.max_connections / 4)
            .max(1)
    }

    /// `--max-connections-per-key` on a listener of `cap` connections (the cap in force,
    /// which the open-file limit may have lowered): as set, else half the cap, or the
    /// tenant's share where that is set lower; 0 = no share.
    pub fn connections_per_key(&self, cap: usize) -> usize {
        self.max_connections_per_key.unwrap_or_else(|| {
            match self.max_connections_per_tenant.filter(|&n| n > 0) {
                Some(tenant) => half_of(cap).min(tenant),
                None => half_of(cap),
            }
        })
    }

    /// `--max-connections-per-tenant` on a listener of `cap` connections: as set, else half
    /// the cap, or the key's share where that is set higher; 0 = no share.
    pub fn connections_per_tenant(&self, cap: usize) -> usize {
        self.max_connections_per_tenant
            .unwrap_or_else(|| match self.max_connections_per_key {
                Some(key) => half_of(cap).max(key),
                None => half_of(cap),
            })
    }

    /// Refuses settings whose relation makes no sense: one tenant's waiters, each holding a
    /// connection, must leave most of `--max-connections` to everyone else; a share of
    /// connections that is set must let a tenant's long polls reach the waiter cap (the one
    /// rule that refuses them), fit in the cap, and a key's fit in its tenant's.
    pub fn check_connection_shares(&self) -> anyhow::Result<()> {
        if self.metrics_open && self.metrics_token.is_some() {
            anyhow::bail!(
                "--metrics-open serves /metrics without a token, --metrics-token requires one: \
                 set one of them"
            );
        }
        if let Some(per_tenant) = self.max_waiters_per_tenant
            && per_tenant.saturating_mul(2) > self.max_connections
        {
            anyhow::bail!(
                "--max-waiters-per-tenant ({per_tenant}) must be at most half of \
                 --max-connections ({}): each waiter holds a connection, and one tenant must \
                 not be able to take most of them",
                self.max_connections
            );
        }
        let waiters = self.waiters_per_tenant();
        for (flag, share) in [
            ("--max-connections-per-key", self.max_connections_per_key),
            (
                "--max-connections-per-tenant",
                self.max_connections_per_tenant,
            ),
        ] {
            let Some(share) = share.filter(|&n| n > 0) else {
                continue;
            };
            if share < waiters {
                anyhow::bail!(
                    "{flag} ({share}) must be at least --max-waiters-per-tenant ({waiters}): \
                     each long poll holds a connection, and a tenant's long polls are bounded \
                     by the waiter cap, not refused for their connections first (or 0: no \
                     share)"
                );
            }
            if share > self.max_connections {
                anyhow::bail!(
                    "{flag} ({share}) must be at most --max-connections ({})",
                    self.max_connections
                );
            }
        }
        if let (Some(key), Some(tenant)) = (
            self.max_connections_per_key,
            self.max_connections_per_tenant,
        ) && key > 0
            && tenant > 0
            && key > tenant
        {
            anyhow::bail!(
                "--max-connections-per-key ({key}) must be at most \
                 --max-connections-per-tenant ({tenant}): a key's connections count against \
                 its tenant's too"
            );
        }
        Ok(())
    }

    /// `--header-read-timeout-ms` as a duration.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }
}

impl RedisSettings {
    /// Settings for a Redis at `url`, otherwise the defaults.
    pub fn for_url(url: impl Into<String>) -> Self {
        Self::for_target(RedisTarget::Standalone(url.into()))
    }

    /// Settings for `target`, otherwise the defaults (those of the flags).
    pub fn for_target(target: RedisTarget) -> Self {
        let mut settings: Self = defaults_of();
        match target {
            RedisTarget::Standalone(url) => settings.redis_url = url,
            RedisTarget::Cluster(seeds) => settings.redis_cluster = seeds,
        }
        settings
    }
}

/// Everything `Application::build` needs.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub api: ApiSettings,
    pub redis: RedisSettings,
}

impl AppConfig {
    /// The store's view of these settings.
    pub fn store(&self) -> StoreConfig {
        self.redis.store_config(&self.api)
    }
}

impl RedisSettings {
    /// Where Redis is: the cluster when seed nodes are given, else the URL.
    pub fn target(&self) -> RedisTarget {
        if self.redis_cluster.is_empty() {
            RedisTarget::Standalone(self.redis_url.clone())
        } else {
            RedisTarget::Cluster(self.redis_cluster.clone())
        }
    }

    /// The store's configuration, with the data policy of `api`.
    pub fn store_config(&self, api: &ApiSettings) -> StoreConfig {
        StoreConfig {
            redis: self.target(),
            connections: self.redis_connections,
            admission_group: usize::from(self.redis_admission_group),
            op_timeout: Duration::from_millis(self.redis_timeout_ms),
            replica_acks: self.redis_replica_acks,
            shards: self.shards,
            dedicated_shards: self.dedicated_shards,
            initial_layout: self.initial_layout.and_then(Layout::from_number),
            default_max_concurrent: api.default_max_concurrent,
            default_max_queued: api.default_max_queued,
            default_max_bytes: api.default_max_bytes,
            default_max_retained: api.default_max_retained,
            retention: Duration::from_secs(
                api.retention_secs
                    .unwrap_or(api.retention_days.saturating_mul(86_400)),
            ),
            dedup_ttl: Duration::from_secs(api.dedup_ttl_hours * 3_600),
            dlq_cap: api.dlq_cap,
            dlq_tenant_cap: api.dlq_tenant_cap,
            start_log: api.start_log,
        }
    }
}

/// Half of a connection cap, at least one: the default share of one key, or one tenant.
fn half_of(cap: usize) -> usize {
    (cap / 2).max(1)
}

/// The settings `T` with nothing given: no flag, no `SLUICE_*` variable (whatever the process
/// environment holds), no file. The flags' attributes are the one home of every default; this
/// is how the library (`ApiSettings::defaults`, ...) reads them.
fn defaults_of<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("sluice")).mut_args(|a| a.env(None));
    command
        .try_get_matches_from(["sluice"])
        .and_then(|m| T::from_arg_matches(&m))
        .expect("every setting has a default or is optional")
}

/// Whether a flag or an environment variable set this argument (then the file does not).
fn set_outside_file(m: &clap::ArgMatches, id: &str) -> bool {
    matches!(
        m.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

impl Cli {
    /// Parses the process's arguments, environment and optional config file.
    pub fn load() -> Result<Self, clap::Error> {
        Self::load_from(std::env::args_os())
    }

    /// Parses `args` (the program name first), the environment and the config file named by
    /// `--config` / `SLUICE_CONFIG`.
    ///
    /// Precedence: flag, then `SLUICE_*` variable, then the file, then the default. The file
    /// is TOML; its top-level keys are settings named like their flags (`redis-url` or
    /// `redis_url`) and apply to whichever command has that setting; a table named after a
    /// command (`[serve]`, `[dev]`, ...) applies to that command only. Unknown keys are errors.
    pub fn load_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let command = Self::command();
        let matches = command.clone().try_get_matches_from(&args)?;
        let Some(path) = matches.get_one::<PathBuf>("config") else {
            return Self::from_arg_matches(&matches);
        };
        let invalid = |msg: String| clap::Error::raw(ErrorKind::InvalidValue, msg + "\n");
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(format!("cannot read config file {}: {e}", path.display())))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e| invalid(format!("config file {}: {e}", path.display())))?;
        let Some((name, sub_matches)) = matches.subcommand() else {
            return Self::from_arg_matches(&matches);
        };
        let sub = command
            .find_subcommand(name)
            .ok_or_else(|| invalid(format!("unknown command {name}")))?;
        let mut extra: Vec<OsString> = Vec::new();
        for (key, value) in &table {
            if let toml::Value::Table(section) = value {
                let Some(target) = command.find_subcommand(key) else {
                    return Err(invalid(format!("config file: no command [{key}]")));
                };
                for (k, v) in section {
                    let arg = find_arg(target, k).ok_or_else(|| {
                        invalid(format!("config file: [{key}] has no setting {k}"))
                    })?;
                    if key == name && !set_outside_file(sub_matches, arg.get_id().as_str()) {
                        extra.extend(file_value_args(arg, v).map_err(invalid)?);
                    }
                }
                continue;
            }
            let (arg, m) = match (find_arg(sub, key), find_arg(&command, key)) {
                (Some(a), _) => (a, sub_matches),
                (None, Some(a)) => (a, &matches),
                (None, None) => {
                    let known = command
                        .get_subcommands()
                        .any(|c| find_arg(c, key).is_some());
                    if known {
                        continue;
                    }
                    return Err(invalid(format!("config file: no setting {key}")));
                }
            };
            if !set_outside_file(m, arg.get_id().as_str()) {
                extra.extend(file_value_args(arg, value).map_err(invalid)?);
            }
        }
        let mut all = args;
        all.extend(extra);
        let matches = command.try_get_matches_from(all)?;
        Self::from_arg_matches(&matches)
    }
}

/// The settable argument of `cmd` named `key` (`redis-url` or `redis_url`).
fn find_arg<'a>(cmd: &'a clap::Command, key: &str) -> Option<&'a clap::Arg> {
    let long = key.replace('_', "-");
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()) && long != "config" && long != "help")
}

/// Command-line words that set `arg` to a file value.
fn file_value_args(arg: &clap::Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let flag = format!("--{}", arg.get_long().unwrap_or_default());
    let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let word = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        other => Err(format!(
            "config file: {flag} cannot be {}",
            other.type_str()
        )),
    };
    match value {
        toml::Value::Boolean(b) if !takes_value => Ok(if *b {
            vec![flag.clone().into()]
        } else {
            vec![]
        }),
        toml::Value::Array(items) if takes_value => items
            .iter()
            .map(|v| Ok(vec![flag.clone().into(), word(v)?.into()]))
            .collect::<Result<Vec<Vec<OsString>>, String>>()
            .map(|v| v.into_iter().flatten().collect()),
        v if takes_value => Ok(vec![flag.clone().into(), word(v)?.into()]),
        _ => Err(format!(
            "config file: {flag} is a switch: use true or false"
        )),
    }
}
