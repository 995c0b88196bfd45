#!/usr/bin/env bash
# Runs sluice's whole test suite. Every test starts its own redis-server on a free port, so
# the only thing needed is the redis-server program, installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
cargo test --locked "$@"
