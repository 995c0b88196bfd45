#!/usr/bin/env bash
# The web console in a real browser: Debian's chromium and chromium-driver (installed with
# apt-get when missing; nothing downloads a browser at run time) driven by Selenium (from PyPI,
# pinned, in a virtualenv under the cargo target folder, reused by later runs) against a live
# `sluice serve` + `sluice worker --demo-flows` on loopback, with its own redis-server
# (scripts/console_test.py). About a minute; bounded to four.
# Usage: scripts/console_test.sh [--update-docs] [path to the sluice binary; default: a debug build]
#   --update-docs  also writes the pages' screenshots to docs/console/ (shown in docs/console.md)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
ensure_python_venv
ensure_chromium

SELENIUM_VERSION=4.45.0
update_docs=""
if [ "${1:-}" = "--update-docs" ]; then
  update_docs=1
  shift
fi
target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/sluice}"
if [ ! -x "$bin" ]; then
  cargo build --locked
fi
work="$target/console-test"
venv="$work/venv"
if ! "$venv/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '$SELENIUM_VERSION')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "selenium==$SELENIUM_VERSION"
fi
shots="$work/screenshots"
rm -rf "$shots" "$work/failure.png" "$work/failure.html"
# Selenium Manager must not look for (or fetch) a driver: the paths are given.
export SE_OFFLINE=true
timeout 240 "$venv/bin/python" scripts/console_test.py "$bin" "$work" --screenshots "$shots"
if [ -n "$update_docs" ]; then
  mkdir -p docs/console
  cp "$shots"/*.png docs/console/
  echo "console test: screenshots copied to docs/console/"
fi
