#!/usr/bin/env bash
# Builds sluice and its benchmark in release mode and runs the benchmark (arguments are passed
# on: --json, --smoke, --cluster, --compare-standalone, --admission-secs 20, ...; see
# `sluice-bench --help`). The benchmark starts its own redis-server (with --cluster, the masters
# of a local Redis Cluster) and sluice processes on loopback; nothing else is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
cargo build --release --locked --bin sluice --bin sluice-bench
exec "${CARGO_TARGET_DIR:-target}/release/sluice-bench" "$@"
