#!/usr/bin/env bash
# Runs sluice's whole test suite:
#   1. the Rust tests, every test on its own redis-server on a free port;
#   2. the integration suite again, every test on its own local 3-master Redis Cluster
#      (SLUICE_TEST_CLUSTER=1; three `redis-server --cluster-enabled yes`, slots assigned by the
#      test helpers), which also runs the cluster-only tests: a master killed, a failover, a
#      shard moved under load;
#   3. the integration suite once more on standalone Redises that record key layout 5
#      (SLUICE_TEST_LAYOUT=5: execution ids stored as 16 bytes; reached only by tests and the
#      benchmark until its migration lands, see CONTRIBUTING.md), so that layout cannot rot;
#   4. the generated-client round trip (a Python client generated from openapi/openapi.json
#      drives a live server);
#   5. the TypeScript client: `redocly lint` of openapi/openapi.json, a client generated with
#      openapi-typescript type-checked under `tsc --strict` and run against a live server;
#   6. Schemathesis against a live server as each kind of caller, the worker key included
#      (about two and a half minutes);
#   7. the web console in a real browser (Debian's chromium + chromedriver, Selenium) against a
#      live server and worker (about a minute).
# Installs redis-server, python3 with venv, node with npm, and chromium with chromium-driver,
# when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
# The pull API's example worker (examples/pull_worker.py) runs inside the Rust suite.
ensure_python_venv
cargo test --locked "$@"
SLUICE_TEST_CLUSTER=1 cargo test --locked --test api "$@"
SLUICE_TEST_LAYOUT=5 cargo test --locked --test api "$@"
bash scripts/client_roundtrip.sh
bash scripts/ts_client.sh
bash scripts/api_fuzz.sh
bash scripts/console_test.sh
