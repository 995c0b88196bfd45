#!/usr/bin/env bash
# Generated-client round trip: generates a Python client from openapi/openapi.json with
# openapi-python-client (installed from PyPI into a virtualenv under the cargo target folder,
# reused by later runs) and drives a live `sluice serve` with it (scripts/client_roundtrip.py
# starts its own redis-server and sluice on free loopback ports).
# Usage: scripts/client_roundtrip.sh [path to the sluice binary; default: a debug build]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
ensure_python_venv

OPC_VERSION=0.29.1
target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/sluice}"
if [ ! -x "$bin" ]; then
  cargo build --locked
fi
work="$target/client-roundtrip"
venv="$work/venv"
ensure_pinned_venv "$venv" openapi-python-client "$OPC_VERSION" openapi-python-client
rm -rf "$work/gen"
mkdir -p "$work/gen"
if ! "$venv/bin/openapi-python-client" generate --path openapi/openapi.json \
    --output-path "$work/gen/sluice_client" --meta none >"$work/generate.log" 2>&1; then
  cat "$work/generate.log" >&2
  echo "error: openapi-python-client could not generate a client" >&2
  exit 1
fi
echo "client round trip: generated $work/gen/sluice_client with openapi-python-client $OPC_VERSION"
PYTHONPATH="$work/gen" "$venv/bin/python" scripts/client_roundtrip.py "$bin"
