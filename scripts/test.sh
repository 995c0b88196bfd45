#!/usr/bin/env bash
# Runs sluice's whole test suite: the Rust tests (every test starts its own redis-server on a
# free port), then the generated-client round trip (a Python client generated from
# openapi/openapi.json drives a live server), then Schemathesis against a live server as each
# kind of caller (about two minutes). Installs redis-server, and python3 with venv, when
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
cargo test --locked "$@"
bash scripts/client_roundtrip.sh
bash scripts/api_fuzz.sh
