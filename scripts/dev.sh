#!/usr/bin/env bash
# Runs sluice locally with its embedded default (`sluice dev`): its own redis-server (data and
# AOF in ./.sluice-dev), the API on 127.0.0.1:8080 in dev-auth mode. Extra arguments go to
# `sluice dev` (see `cargo run -- dev --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
exec cargo run --release --locked -- dev "$@"
