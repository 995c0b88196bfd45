#!/usr/bin/env bash
# What 16-byte binary execution ids would save per execution, by structure, on a fresh
# default-config redis-server (issue 39 item 2; bench/README.md, "Binary ids, layout 5").
#
#   bench/id-bytes/run.sh [COUNT] [STATE]    # COUNT 100000, STATE queued|completed
#   CLUSTER=1 bench/id-bytes/run.sh ...       # the same on a one-node Redis Cluster
#
# For each variant (hex ids and `exec:`, the layout-4 store; binary ids with `exec:`; binary
# ids with `e:`; binary ids, dedup digest and request fingerprint) it starts redis-server on a free loopback port (no persistence, every other
# setting Redis's default), writes 8 executions with fill.lua, reads used_memory and
# measure.lua's sums, writes COUNT more, reads both again and prints the growth per execution:
# the same arithmetic as the cost benchmark's bytes figure (bench/sluice-bench/src/cost/
# bytes.rs), whose layout-4 numbers the first variant reproduces (row 264, listing 135.9, queue
# 135.8, dedup bucket 93.2, keyspace 35.4 at 100 000 queued).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
count=${1:-100000}
state=${2:-queued}
dir=$(mktemp -d)
pid=
stop() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$dir"; }
trap stop EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

variant() {
  local binary=$1 rowp=$2 packed=${3:-0} port
  port=$(free_port)
  local cluster=()
  [[ ${CLUSTER:-0} == 1 ]] && cluster=(--cluster-enabled yes --cluster-config-file "$dir/nodes-$port.conf")
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    "${cluster[@]}" >"$dir/redis.log" 2>&1 &
  pid=$!
  local c="redis-cli -p $port"
  for _ in $(seq 100); do $c ping >/dev/null 2>&1 && break; sleep 0.1; done
  if [[ ${CLUSTER:-0} == 1 ]]; then
    # One node holding every slot: a cluster's per-key costs (each key is also on its
    # slot's list), without redirections for the scripts.
    $c cluster addslotsrange 0 16383 >/dev/null
    for _ in $(seq 100); do
      $c cluster info | grep -q 'cluster_state:ok' && break
      sleep 0.1
    done
  fi
  $c --eval "$here/fill.lua" , 0 8 "$binary" "$rowp" 8 "$state" "$packed" >/dev/null
  local m0 k0 m1 k1
  m0=$($c info memory | tr -d '\r' | sed -n 's/^used_memory://p')
  k0=$($c --eval "$here/measure.lua")
  local at=8
  while (( at < count + 8 )); do
    local n=$(( count + 8 - at < 10000 ? count + 8 - at : 10000 ))
    $c --eval "$here/fill.lua" , "$at" "$n" "$binary" "$rowp" 8 "$state" "$packed" >/dev/null
    at=$(( at + n ))
  done
  m1=$($c info memory | tr -d '\r' | sed -n 's/^used_memory://p')
  k1=$($c --eval "$here/measure.lua")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  python3 - "$count" "$m0" "$m1" "$binary" "$rowp" "$state" "$k0" "$k1" "$packed" <<'PY'
import sys
n, m0, m1 = map(int, sys.argv[1:4])
binary, rowp, state, k0, k1, packed = sys.argv[4:10]
def parse(text):
    sums, enc = {}, []
    for line in text.strip().splitlines():
        w = line.split()
        if w[0] == 'enc':
            enc.append(f"{w[1]} {w[2]}")
        else:
            sums[w[0]] = int(w[1])
    return sums, enc
a, _ = parse(k0)
b, enc = parse(k1)
ids = 'binary ids' if binary == '1' else 'hex ids'
if packed == '1':
    ids += ', digest and fingerprint'
print(f"{ids}, row key <p>{rowp}<id>, {n} {state}: {(m1 - m0) / n:.1f} B per execution")
kinds = 0
for k in ['row', 'listing', 'queue', 'dedup']:
    g = b.get(k, 0) - a.get(k, 0)
    kinds += g
    print(f"  {k:9s}{g / n:8.1f}")
print(f"  {'keyspace':9s}{((m1 - m0) - kinds) / n:8.1f}")
print("  encodings: " + ", ".join(sorted(enc)))
PY
}

variant 0 exec:
variant 1 exec:
variant 1 e:
variant 1 exec: 1
