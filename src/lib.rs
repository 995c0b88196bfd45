//! sluice: an HTTP execution-admission server and worker runtime on Redis.
//!
//! - [`access`]: tenant API keys as values — token format, roles, secret hashing.
//! - [`domain`]: the domain — validated ids, admission requests, the execution view.
//! - [`store`]: Redis — key names, and the Lua operations in `migrations-lua/` (every state
//!   change one atomic script on one hash slot).
//! - [`http`]: the API — routes with their OpenAPI docs, errors as problem+json, auth.
//! - [`app`]: wiring a config into a bound, runnable server.
//! - [`server`]: serving connections, bounded in number and in time.
//! - [`worker`]: the worker runtime — handlers, leases, heartbeats, orphan recovery.
//! - [`sweeper`]: the background repair of what should never drift.
//! - [`waiters`]: clients waiting on executions, served by one Pub/Sub listener per process.
//! - [`pull`]: the wake-ups `serve` reads once for all pull workers' long polls.
//! - [`revocation`]: withdrawn credentials end open waits; unknown tokens cost no Redis call.
//! - [`dev`]: the embedded default, `sluice dev`, with the Redis it manages.
//! - [`redis_server`]: starting `redis-server` on loopback, for `dev`, the tests and the bench.
//! - [`tls`]: the TLS of outgoing HTTP (webhooks, `http` flow handlers, OTLP).
//! - [`config`]: flags and `SLUICE_*` environment variables.
//! - [`commands`]: what each subcommand does (`main.rs` only dispatches).

pub mod access;
pub mod app;
pub mod commands;
pub mod config;
pub mod delivery;
pub mod dev;
pub mod domain;
pub mod http;
pub mod migrate;
pub mod otel;
pub mod pull;
pub mod redis_server;
pub mod reshard;
pub mod revocation;
pub mod server;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod tls;
pub mod waiters;
pub mod worker;

pub use app::Application;
