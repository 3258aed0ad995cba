#!/usr/bin/env bash
# tools/call throughput of 1 and of 3 `ring0 serve --http` replicas on one PostgreSQL journal,
# with a mutating upstream (tests' counting_upstream.py: one effect per idempotency key), both
# measured in the same run. Prints both figures and their ratio against the 2.5x target.
#
#   bash bench/replicas/run.sh                 # 20 s per measurement, 12 concurrent clients
#   DURATION_S=60 CONCURRENCY=24 bash bench/replicas/run.sh
#
# Uses RING0_BIN (default: target/release/ring0, else target/debug/ring0), the Python of the
# installed MCP peers (MCP_PEERS_DIR) for the upstream and the load, and a throw-away PostgreSQL
# cluster of its own (scripts/test-postgres.sh). The load generator shares the machine with the
# replicas: on a machine with fewer cores than replicas + 1 the figure measures the cores, not
# the replicas (the script prints the core count beside the figures).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
duration=${DURATION_S:-20}
concurrency=${CONCURRENCY:-12}
bin=${RING0_BIN:-}
if [ -z "$bin" ]; then
    if [ -x "$root/target/release/ring0" ]; then bin=$root/target/release/ring0; else bin=$root/target/debug/ring0; fi
fi
peers=${MCP_PEERS_DIR:-$root/target/mcp-peers}
py=$peers/py/bin/python
[ -x "$bin" ] || { echo "no ring0 binary at $bin (cargo build -p ring0 --release)" >&2; exit 1; }
[ -x "$py" ] || { echo "no Python at $py (scripts/install-mcp-peers.sh)" >&2; exit 1; }

work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    bash "$root/scripts/test-postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
eval "$(bash "$root/scripts/test-postgres.sh" start "$work/pg")"
base=$RING0_TEST_POSTGRES_URL

# Replicas of one run: a fresh schema, a workspace with the counting upstream.
start_replicas() {
    local n=$1 schema=bench_$1 ws=$work/ws$1
    mkdir -p "$ws"
    psql "$base" -qc "CREATE SCHEMA $schema"
    local journal="$base?options=-c%20search_path%3D$schema"
    cat > "$ws/ring0.toml" <<TOML
[[grants]]
name = "effects"
tools = ["cx__record"]
ceiling = "A2"

[[upstreams]]
alias = "cx"
command = "$py"
args = ["$root/crates/cli/tests/fixtures/counting_upstream.py", "--dir", "$ws"]

[upstreams.tools.record]
effect = "non_idempotent"
authority = "A2"
strategy = ["exploitation"]
settlement = "idempotency_key"
TOML
    addrs=()
    for i in $(seq 1 "$n"); do
        local log=$ws/r$i.log
        (cd "$ws" && HOME=$ws exec "$bin" --state-dir "$ws/.ring0-$i" serve --http 127.0.0.1:0 --journal "$journal" 2>"$log" >/dev/null) &
        pids+=($!)
        for _ in $(seq 1 600); do
            addr=$(sed -n 's#.*listening on http://\([^/]*\)/mcp.*#\1#p' "$log" | head -n1)
            [ -n "$addr" ] && break
            sleep 0.1
        done
        [ -n "$addr" ] || { echo "replica $i did not start:" >&2; cat "$log" >&2; exit 1; }
        addrs+=("$addr")
    done
}

stop_replicas() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    pids=()
}

measure() {
    start_replicas "$1"
    "$py" "$root/bench/replicas/load.py" "$duration" "$concurrency" "${addrs[@]}"
    stop_replicas
}

one=$(measure 1)
three=$(measure 3)
echo "1 replica:  $one"
echo "3 replicas: $three"
"$py" - "$one" "$three" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$bin" <<'PY'
import json, sys
one, three, cores = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
load, binary = sys.argv[4], sys.argv[5]
ratio = three["calls_per_s"] / one["calls_per_s"] if one["calls_per_s"] else float("nan")
verdict = "met" if ratio >= 2.5 else "NOT met"
print(f"tools/call throughput: 1 replica {one['calls_per_s']}/s, 3 replicas {three['calls_per_s']}/s: "
      f"{ratio:.2f}x (target 2.5x: {verdict}; {cores} cores for the replicas, the database and the load, "
      f"load average {load}; {binary})")
PY
