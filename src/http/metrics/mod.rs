//! `/metrics`: Prometheus metrics in the OpenMetrics text format (which Prometheus scrapes
//! natively). The registry lives in the application state, not in a global, so every test
//! app has its own numbers.
//!
//! - `sluice_admissions_total{tenant,outcome}`: `admitted`, `deduplicated`, `conflict`;
//! - `sluice_admissions_rejected_total{tenant,reason}`: `queue_full`, `storage_full`,
//!   `too_large`, `tenant_disabled`, `invalid`;
//! - `sluice_http_request_duration_seconds{method,route,status}`: a histogram; `route` is the
//!   route template (`/api/executions/{id}`, `unmatched` for none), so ids do not multiply
//!   series, and `method` is one of the methods the API knows or `other` — any token is a
//!   legal method, and a label taken from the request would let anyone grow the registry;
//! - `sluice_http_connections_open` and `sluice_http_connections_refused_total` (beyond
//!   `--max-connections`); `sluice_http_connections_over_key_share_total` and
//!   `sluice_http_connections_over_tenant_share_total` (connections refused for their
//!   credential's share, `--max-connections-per-key` and `--max-connections-per-tenant`; no
//!   label names the key or the tenant);
//! - `sluice_queue_depth{shard}`: queued executions due in each shard (its tenants' queues), read from Redis at
//!   scrape time (absent when Redis does not answer);
//! - `sluice_dead_letters{shard}`: records on each shard's dead-letter stream;
//! - `sluice_shard_events{shard,event}`: cumulative counts the scripts keep on Redis —
//!   `completed`, `failed`, `cancelled`, `reclaimed`, `fenced` (late completions refused),
//!   `dead_lettered`, `dlq_evicted` (dead letters pushed out by the cap), `repaired_*` (sweeper),
//!   `throttled` (a tenant or concurrency key held back by its rate limit until its next token).
//!   They are gauges because Redis, not this process, holds them; they only grow.
//! - `sluice_last_minute_events{shard,event}`: what the per-minute counters (`/api/trends`)
//!   hold for the last complete UTC minute — `admitted`, `started`, `completed`, `failed`,
//!   `cancelled` — and `sluice_last_minute_wait_ms{shard,quantile}` (`0.5`, `0.99`; the
//!   histogram bucket's upper bound, absent in a minute without starts): the same numbers the
//!   console charts, read at scrape time (one 36-byte read per shard).
//! - `sluice_tenant_executions{tenant,state}` (`queued`, `running`),
//!   `sluice_tenant_blocked_keys{tenant}` (concurrency keys at their limit with work waiting
//!   behind it: per-key saturation, without ever naming a key in a label),
//!   `sluice_tenant_throttled_seconds{tenant}` (how long until its rate limit lets it start
//!   again; 0 when not held back),
//!   `sluice_tenant_last_minute_events{tenant,event}` and
//!   `sluice_tenant_last_minute_wait_ms{tenant,quantile}`: the same per tenant, for the
//!   tenants in the shards' busy sets — those with work now, and those whose work ended since
//!   the sweeper last passed over them (with zero executions) — read at scrape time.
//! - `sluice_shards_unreadable`: shards whose numbers could not be read at this scrape (their
//!   series above are absent; the other shards are reported as usual).
//! - `sluice_admission_calls_total` and `sluice_admission_calls_carried_total`: calls of the
//!   admission script this server made, and the admissions they carried (group commit: their
//!   ratio is the mean group); `sluice_admissions_grouping`: admissions waiting now for their
//!   shard's call in flight to end; `sluice_admission_answers_lost_total`: admissions whose
//!   call's answer was lost (each then settled before its answer), of them
//!   `sluice_admission_outcomes_unknown_total` that could not be settled either (answered
//!   `admission_outcome_unknown`); `sluice_admissions_withdrawn_total`: admissions never sent
//!   because their request ran out of time (or went away) while they waited for Redis.
//! - `sluice_completion_calls_total` and `sluice_completion_calls_carried_total`: calls of the
//!   completion script this server made for pull workers' reports, and the reports they carried
//!   (grouped like admissions; `sluice worker` groups its own, and has no endpoint).
//! - `sluice_redis_unconfirmed_answers_total`: with `--redis-replica-acks`, script answers
//!   this server returned before that many replicas acknowledged their writes — the WAIT came
//!   back short, or was skipped while the master was short of replicas (see
//!   `store::ReplicaAcks`). Each is a write a failover may lose although its caller was
//!   answered; alert on it growing.
//! - `sluice_webhook_deliveries_total`, `sluice_webhook_failed_attempts_total` and
//!   `sluice_webhook_dropped_total`: this server's webhook attempts the receiver took (2xx),
//!   those that failed (another status, a time-out, a refused address or certificate), and the
//!   events it dropped for age (`--webhook-max-age-secs`). Per tenant, with what a full outbox
//!   evicted, in `GET /api/tenants/{tenant}/webhook`.
//! - `sluice_waiters`: clients waiting now (long polls and event streams, `--max-waiters`);
//!   `sluice_waiters_listening`: 1 while the server's Pub/Sub listener is connected (0: the
//!   waiters re-read on their own, every few seconds).
//!
//! Every label value comes from a closed set: the `tenant` label names at most
//! `--metrics-tenant-limit` tenants (the first ones seen; later ones are counted under
//! `_other`, which no tenant id can be), and a deleted tenant's series are removed.

mod labels;
mod scrape;

pub use scrape::routes;

use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;

use axum::http::{Method, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::domain::TenantId;
use labels::{
    AdmissionLabels, RejectionLabels, RequestLabels, ShardEventLabels, ShardLabels,
    ShardQuantileLabels, TenantEventLabels, TenantLabels, TenantQuantileLabels, TenantStateLabels,
    latency_histogram,
};

/// The `tenant` label value of tenants beyond `--metrics-tenant-limit` (not a valid tenant id,
/// so it cannot collide with one).
pub const OTHER_TENANTS: &str = "_other";

/// The server's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    admissions: Family<AdmissionLabels, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<ShardLabels, Gauge>,
    dead_letters: Family<ShardLabels, Gauge>,
    shard_events: Family<ShardEventLabels, Gauge>,
    last_minute: Family<ShardEventLabels, Gauge>,
    last_minute_wait: Family<ShardQuantileLabels, Gauge>,
    tenant_executions: Family<TenantStateLabels, Gauge>,
    tenant_blocked_keys: Family<TenantLabels, Gauge>,
    tenant_throttled: Family<TenantLabels, Gauge<f64, AtomicU64>>,
    tenant_last_minute: Family<TenantEventLabels, Gauge>,
    tenant_last_minute_wait: Family<TenantQuantileLabels, Gauge>,
    shards_unreadable: Gauge,
    admission_calls: Counter,
    admission_calls_carried: Counter,
    admission_answers_lost: Counter,
    admission_outcomes_unknown: Counter,
    admissions_withdrawn: Counter,
    completion_calls: Counter,
    completion_calls_carried: Counter,
    admissions_grouping: Gauge,
    webhook_deliveries: Counter,
    webhook_failed_attempts: Counter,
    webhook_dropped: Counter,
    redis_unconfirmed_answers: Counter,
    /// Held while the counters above catch up with the store's (scrapes may overlap).
    catch_up: std::sync::Mutex<()>,
    waiters: Gauge,
    waiters_listening: Gauge,
    pull_long_polls: Gauge,
    pull_bell_connections: Gauge,
    pull_stops_listening: Gauge,
    pull_runs_handed_out: Counter,
    connections_open: Gauge,
    connections_refused: Counter,
    connections_over_key_share: Counter,
    connections_over_tenant_share: Counter,
    /// Tenants with their own label value, at most `tenant_limit`.
    labelled_tenants: RwLock<HashSet<String>>,
    tenant_limit: usize,
}

/// Every admission outcome and rejection reason, to remove a tenant's series.
const OUTCOMES: [&str; 3] = ["admitted", "deduplicated", "conflict"];
const REASONS: [&str; 5] = [
    "queue_full",
    "storage_full",
    "too_large",
    "tenant_disabled",
    "invalid",
];

/// How an admission ended, for the per-tenant counters.
#[derive(Debug, Clone, Copy)]
pub enum AdmissionOutcome {
    Admitted,
    Deduplicated,
    Conflict,
    QueueFull,
    /// Refused by a storage bound (`tenant_storage_full`).
    StorageFull,
    /// Larger than the tenant's `max_bytes` (`execution_too_large`).
    TooLarge,
    Disabled,
    /// Refused: the tenant is being deleted.
    Deleting,
    Invalid,
}

impl Metrics {
    /// A fresh registry with every sluice metric, labelling at most `tenant_limit` tenants.
    pub fn new(tenant_limit: usize) -> Self {
        let mut registry = Registry::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        let rejections = Family::<RejectionLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let queue_depth = Family::<ShardLabels, Gauge>::default();
        let dead_letters = Family::<ShardLabels, Gauge>::default();
        let shard_events = Family::<ShardEventLabels, Gauge>::default();
        let last_minute = Family::<ShardEventLabels, Gauge>::default();
        let last_minute_wait = Family::<ShardQuantileLabels, Gauge>::default();
        registry.register(
            "sluice_last_minute_events",
            "Events per shard in the last complete UTC minute, from the per-minute counters",
            last_minute.clone(),
        );
        registry.register(
            "sluice_last_minute_wait_ms",
            "Waiting time (admission to start) of the last complete minute's starts per shard: the histogram bucket's upper bound at this quantile",
            last_minute_wait.clone(),
        );
        let tenant_executions = Family::<TenantStateLabels, Gauge>::default();
        let tenant_last_minute = Family::<TenantEventLabels, Gauge>::default();
        let tenant_blocked_keys = Family::<TenantLabels, Gauge>::default();
        let tenant_throttled = Family::<TenantLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "sluice_tenant_throttled_seconds",
            "How long until each tenant with work may start again under its rate limit (0: not held back), read at scrape time",
            tenant_throttled.clone(),
        );
        registry.register(
            "sluice_tenant_blocked_keys",
            "Concurrency keys of each tenant with work now at their limit with executions waiting behind it, read at scrape time",
            tenant_blocked_keys.clone(),
        );
        let tenant_last_minute_wait = Family::<TenantQuantileLabels, Gauge>::default();
        registry.register(
            "sluice_tenant_executions",
            "Queued and running executions of each tenant with work now (or lately), read at scrape time",
            tenant_executions.clone(),
        );
        registry.register(
            "sluice_tenant_last_minute_events",
            "Events per tenant in the last complete UTC minute, from the per-minute counters",
            tenant_last_minute.clone(),
        );
        registry.register(
            "sluice_tenant_last_minute_wait_ms",
            "Waiting time of the last complete minute's starts per tenant: the histogram bucket's upper bound at this quantile",
            tenant_last_minute_wait.clone(),
        );
        registry.register(
            "sluice_dead_letters",
            "Records on each shard's dead-letter stream, read at scrape time",
            dead_letters.clone(),
        );
        registry.register(
            "sluice_shard_events",
            "Cumulative events per shard kept on Redis (completed, fenced, dlq_evicted, ...)",
            shard_events.clone(),
        );
        registry.register(
            "sluice_admissions",
            "Admission requests that reached Redis, by tenant and outcome",
            admissions.clone(),
        );
        registry.register(
            "sluice_admissions_rejected",
            "Admission requests refused, by tenant and reason",
            rejections.clone(),
        );
        registry.register(
            "sluice_http_request_duration_seconds",
            "Time to answer an HTTP request, by method, route template and status",
            latency.clone(),
        );
        registry.register(
            "sluice_queue_depth",
            "Queued executions that are due in each shard (its tenants' queues), read at scrape time",
            queue_depth.clone(),
        );
        let shards_unreadable = Gauge::default();
        registry.register(
            "sluice_shards_unreadable",
            "Shards whose numbers could not be read from Redis at this scrape",
            shards_unreadable.clone(),
        );
        let admission_calls = Counter::default();
        registry.register(
            "sluice_admission_calls",
            "Calls of the admission script this server made (each carries one or more admissions)",
            admission_calls.clone(),
        );
        let admission_calls_carried = Counter::default();
        registry.register(
            "sluice_admission_calls_carried",
            "Admissions the admission script calls carried (group commit)",
            admission_calls_carried.clone(),
        );
        let admission_answers_lost = Counter::default();
        registry.register(
            "sluice_admission_answers_lost",
            "Admissions whose call's answer was lost (each settled before it was answered)",
            admission_answers_lost.clone(),
        );
        let admission_outcomes_unknown = Counter::default();
        registry.register(
            "sluice_admission_outcomes_unknown",
            "Lost admissions that could not be settled (answered admission_outcome_unknown)",
            admission_outcomes_unknown.clone(),
        );
        let admissions_withdrawn = Counter::default();
        registry.register(
            "sluice_admissions_withdrawn",
            "Admissions never sent: their request ran out of time or went away while they waited",
            admissions_withdrawn.clone(),
        );
        let completion_calls = Counter::default();
        registry.register(
            "sluice_completion_calls",
            "Calls of the completion script this server made for pull workers (each carries one or more reports)",
            completion_calls.clone(),
        );
        let completion_calls_carried = Counter::default();
        registry.register(
            "sluice_completion_calls_carried",
            "Reports of ended runs the completion script calls carried (group commit)",
            completion_calls_carried.clone(),
        );
        let redis_unconfirmed_answers = Counter::default();
        registry.register(
            "sluice_redis_unconfirmed_answers",
            "Script answers returned before the replicas --redis-replica-acks asks for acknowledged their writes (a failover may lose those writes)",
            redis_unconfirmed_answers.clone(),
        );
        let admissions_grouping = Gauge::default();
        registry.register(
            "sluice_admissions_grouping",
            "Admissions waiting now for their shard's admission call in flight to end",
            admissions_grouping.clone(),
        );
        let waiters = Gauge::default();
        registry.register(
            "sluice_waiters",
            "Clients waiting on executions now (long polls and event streams)",
            waiters.clone(),
        );
        let waiters_listening = Gauge::default();
        registry.register(
            "sluice_waiters_listening",
            "1 while the Pub/Sub listener that serves the waiters is connected",
            waiters_listening.clone(),
        );
        let pull_long_polls = Gauge::default();
        registry.register(
            "sluice_pull_long_polls",
            "Pull workers' lease long polls waiting now (/api/worker/lease?wait=)",
            pull_long_polls.clone(),
        );
        let pull_bell_connections = Gauge::default();
        registry.register(
            "sluice_pull_bell_connections",
            "Pooled blocking connections the doorbell readers of the pull API hold (idle or in use)",
            pull_bell_connections.clone(),
        );
        let pull_stops_listening = Gauge::default();
        registry.register(
            "sluice_pull_stops_listening",
            "1 while the pull workers' stop messages are heard (their Pub/Sub connection is up)",
            pull_stops_listening.clone(),
        );
        let webhook_deliveries = Counter::default();
        registry.register(
            "sluice_webhook_deliveries",
            "Webhook attempts of this server that the receiver took (answered 2xx)",
            webhook_deliveries.clone(),
        );
        let webhook_failed_attempts = Counter::default();
        registry.register(
            "sluice_webhook_failed_attempts",
            "Webhook attempts of this server that failed (another status, a time-out, a refused address or certificate); the event is sent again",
            webhook_failed_attempts.clone(),
        );
        let webhook_dropped = Counter::default();
        registry.register(
            "sluice_webhook_dropped",
            "Webhook events this server dropped undelivered for age (--webhook-max-age-secs)",
            webhook_dropped.clone(),
        );
        let pull_runs_handed_out = Counter::default();
        registry.register(
            "sluice_pull_runs_handed_out",
            "Runs handed to pull workers by lease calls (recovered ones included)",
            pull_runs_handed_out.clone(),
        );
        let connections_open = Gauge::default();
        let connections_refused = Counter::default();
        registry.register(
            "sluice_http_connections_open",
            "HTTP connections open now",
            connections_open.clone(),
        );
        registry.register(
            "sluice_http_connections_refused",
            "HTTP connections refused at the --max-connections cap",
            connections_refused.clone(),
        );
        let connections_over_key_share = Counter::default();
        registry.register(
            "sluice_http_connections_over_key_share",
            "HTTP connections refused (429 key_too_many_connections) because their API key held \
             --max-connections-per-key",
            connections_over_key_share.clone(),
        );
        let connections_over_tenant_share = Counter::default();
        registry.register(
            "sluice_http_connections_over_tenant_share",
            "HTTP connections refused (429 tenant_too_many_connections) because their tenant's \
             keys held --max-connections-per-tenant",
            connections_over_tenant_share.clone(),
        );
        Self {
            registry,
            admissions,
            rejections,
            latency,
            queue_depth,
            dead_letters,
            shard_events,
            last_minute,
            last_minute_wait,
            tenant_executions,
            tenant_blocked_keys,
            tenant_throttled,
            tenant_last_minute,
            tenant_last_minute_wait,
            shards_unreadable,
            admission_calls,
            admission_calls_carried,
            admission_answers_lost,
            admission_outcomes_unknown,
            admissions_withdrawn,
            completion_calls,
            completion_calls_carried,
            admissions_grouping,
            webhook_deliveries,
            webhook_failed_attempts,
            webhook_dropped,
            redis_unconfirmed_answers,
            catch_up: std::sync::Mutex::new(()),
            waiters,
            waiters_listening,
            pull_long_polls,
            pull_bell_connections,
            pull_stops_listening,
            pull_runs_handed_out,
            connections_open,
            connections_refused,
            connections_over_key_share,
            connections_over_tenant_share,
            labelled_tenants: RwLock::new(HashSet::new()),
            tenant_limit,
        }
    }

    /// The `tenant` label value of `tenant`: its id while there is room, else `_other`.
    fn tenant_label(&self, tenant: &TenantId) -> String {
        let id = tenant.as_str();
        // A poisoned lock only means another request panicked mid-insert; the set is intact.
        let known = self
            .labelled_tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id);
        if known {
            return id.to_owned();
        }
        let mut set = self
            .labelled_tenants
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if set.contains(id) || set.len() < self.tenant_limit {
            set.insert(id.to_owned());
            id.to_owned()
        } else {
            OTHER_TENANTS.to_owned()
        }
    }

    /// Runs a lease call handed out.
    pub fn pull_handed_out(&self, runs: usize) {
        self.pull_runs_handed_out.inc_by(runs as u64);
    }

    /// Drops a deleted tenant's series and frees its label for another tenant.
    pub fn forget_tenant(&self, tenant: &TenantId) {
        let removed = self
            .labelled_tenants
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant.as_str());
        if !removed {
            return;
        }
        for outcome in OUTCOMES {
            self.admissions.remove(&AdmissionLabels {
                tenant: tenant.to_string(),
                outcome,
            });
        }
        for reason in REASONS {
            self.rejections.remove(&RejectionLabels {
                tenant: tenant.to_string(),
                reason,
            });
        }
    }

    /// A connection was accepted.
    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    /// An accepted connection closed.
    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    /// A connection was refused at the cap.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// A connection was refused for its credential's share (counted once per connection).
    pub fn connection_over_share(&self, refusal: super::ConnectionRefusal) {
        match refusal {
            super::ConnectionRefusal::Key { .. } => self.connections_over_key_share.inc(),
            super::ConnectionRefusal::Tenant { .. } => self.connections_over_tenant_share.inc(),
        };
    }

    /// Counts one admission of `tenant`.
    pub fn admission(&self, tenant: &TenantId, outcome: AdmissionOutcome) {
        let tenant = self.tenant_label(tenant);
        let (counted, reason) = match outcome {
            AdmissionOutcome::Admitted => (Some("admitted"), None),
            AdmissionOutcome::Deduplicated => (Some("deduplicated"), None),
            AdmissionOutcome::Conflict => (Some("conflict"), None),
            AdmissionOutcome::QueueFull => (None, Some("queue_full")),
            AdmissionOutcome::StorageFull => (None, Some("storage_full")),
            AdmissionOutcome::TooLarge => (None, Some("too_large")),
            AdmissionOutcome::Disabled => (None, Some("tenant_disabled")),
            AdmissionOutcome::Deleting => (None, Some("tenant_deleting")),
            AdmissionOutcome::Invalid => (None, Some("invalid")),
        };
        if let Some(outcome) = counted {
            self.admissions
                .get_or_create(&AdmissionLabels { tenant, outcome })
                .inc();
        } else if let Some(reason) = reason {
            self.rejections
                .get_or_create(&RejectionLabels { tenant, reason })
                .inc();
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(DEFAULT_TENANT_LIMIT)
    }
}

/// Tenants labelled by default (`--metrics-tenant-limit`).
pub const DEFAULT_TENANT_LIMIT: usize = 1000;

/// The `method` label value: the method's name when the API knows it, else `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

impl Metrics {
    /// Records one request's duration under its route template (`None`: no route matched).
    pub fn observe_latency(
        &self,
        method: &Method,
        route: Option<String>,
        status: StatusCode,
        took: std::time::Duration,
    ) {
        self.latency
            .get_or_create(&RequestLabels {
                method: method_label(method),
                route: route.unwrap_or_else(|| "unmatched".to_owned()),
                status: status.as_u16(),
            })
            .observe(took.as_secs_f64());
    }
}
