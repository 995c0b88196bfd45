//! The integration suite, one binary (link time matters): every test starts its own
//! `redis-server` on a free port and the real application on port 0.

mod access;
mod admission;
mod bad_input;
mod chaining;
mod cluster;
mod config;
mod connections;
mod console;
mod deployment;
mod dev;
mod dispatch;
mod faults;
mod fences;
mod forecast;
mod guarantees;
mod handlers;
mod helpers;
mod keys;
mod layout;
mod listing;
mod openapi;
mod operability;
mod pinning;
mod pull;
mod quota;
mod redis_trouble;
mod shards;
mod spans;
mod stalls;
mod throttle;
mod trends;
mod waiting;
mod wakeups;
mod webhooks;
mod worker;
