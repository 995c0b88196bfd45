#!/usr/bin/env bash
# Schema-driven fuzzing: Schemathesis (from PyPI, in a virtualenv under the cargo target folder,
# reused by later runs) against a live `sluice serve`, as a worker, a viewer, an editor and an admin key
# of a tenant and as the platform admin, with all checks and bounded examples and time
# (scripts/api_fuzz.py starts its own redis-server and sluice on free loopback ports). Any
# failure, or any 5xx answer, fails the script.
# Usage: scripts/api_fuzz.sh [path to the sluice binary; default: a debug build]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
ensure_python_venv

ST_VERSION=4.32.5
target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/sluice}"
if [ ! -x "$bin" ]; then
  cargo build --locked
fi
work="$target/api-fuzz"
venv="$work/venv"
ensure_pinned_venv "$venv" schemathesis "$ST_VERSION" schemathesis
"$venv/bin/python" scripts/api_fuzz.py "$bin" "$venv/bin/schemathesis" "$work"
