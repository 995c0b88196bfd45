#!/usr/bin/env bash
# Builds sluice and its benchmark in release mode and runs the benchmark (arguments are passed
# on: --json, --smoke, --cluster, --compare-standalone, --push-only, --fairness-only,
# --skip-fairness, --limits-only, --skip-limits, --dlq-only, --skip-dlq,
# --compare-builds BEFORE AFTER,
# --compare-keyed, --cost, --admission-secs 20, ...; see `sluice-bench --help`). The benchmark starts
# its own redis-server (with --cluster, the masters of a local Redis Cluster) and sluice
# processes on loopback; nothing else is needed.
# The BullMQ peer of the admission, end-to-end, pickup and noisy-neighbour phases (bench/bullmq)
# is installed with `npm ci` into the cargo target folder when missing (Node.js and npm with
# apt-get when missing); when that fails the benchmark runs without it and its report says so.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
target="${CARGO_TARGET_DIR:-target}"
case " $* " in
  *" --skip-bullmq "* | *" --compare-builds "* | *" --compare-keyed "* | *" --limits-only "* | *" --dlq-only "* | *" --serve-cpu "*) ;;
  *)
    if ensure_node && ensure_npm_project bench/bullmq "$target/bench-bullmq"; then
      SLUICE_BENCH_BULLMQ_DIR="$(cd "$target/bench-bullmq" && pwd)"
      export SLUICE_BENCH_BULLMQ_DIR
    else
      echo "WARNING: the BullMQ peer could not be installed; the benchmark runs without it" >&2
    fi
    ;;
esac
# `--cost` counts redis-server's instructions with valgrind's callgrind (Debian's package
# `valgrind`, installed with apt-get when missing); without it those figures say NOT RUN.
case " $* " in
  *" --cost "* | *" --serve-cpu "*)
    ensure_installed "valgrind (the instruction counts of --cost and --serve-cpu)" \
      'command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1' valgrind ||
      echo "WARNING: valgrind could not be installed; --cost's instruction counts say NOT RUN (--serve-cpu needs it)" >&2
    ;;
esac
# Both packages of the workspace: the server (`sluice`) and the benchmark (bench/sluice-bench).
cargo build --release --locked -p sluice -p sluice-bench
exec "$target/release/sluice-bench" "$@"
