#!/usr/bin/env bash
# The PostgreSQL journal's commit benchmark (`cargo bench -p ring0-journal --bench commit`,
# its PostgreSQL part: single against grouped commits at 1 and 64 proposers) on two throw-away
# clusters, one after the other:
#
# - durable (`fsync=on`, `synchronous_commit=on`): a COMMIT waits for its WAL flush to the
#   disk, as on a production server;
# - `fsync=off`, `synchronous_commit=off` (the tests' cluster): a COMMIT costs a round trip,
#   and the figure measures round trips and CPU alone.
#
# Prints each run's figures, then both summaries together.
#
#   bash bench/journal/run.sh
#   BENCH_DIR=/mnt/disk bash bench/journal/run.sh   # where the clusters live (default: target/)
#
# The clusters live under BENCH_DIR (default the target directory: a real disk, where fsync
# costs what it costs; not a tmpfs) and are stopped and deleted at the end. The benchmark, the
# server and anything else running share the machine's cores: the script prints the core count
# and the load average beside the figures.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
base=${BENCH_DIR:-$root/target}
mkdir -p "$base"
work=$(mktemp -d "$base/bench-journal.XXXXXX")
chmod 755 "$work"
clusters=()
cleanup() {
    for c in "${clusters[@]}"; do
        bash "$root/scripts/test-postgres.sh" stop "$c" >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# Builds first, so neither cluster idles through the compile.
(cd "$root" && cargo bench -p ring0-journal --bench commit --no-run >&2)

# Runs the benchmark's PostgreSQL part against a new cluster (`start` or `start-durable`).
measure() {
    local how=$1 dir=$work/$1
    clusters+=("$dir")
    local url
    url=$(bash "$root/scripts/test-postgres.sh" "$how" "$dir" | sed -n 's/^export RING0_TEST_POSTGRES_URL=//p')
    [ -n "$url" ] || { echo "the $how cluster did not start" >&2; exit 1; }
    (cd "$root" && RING0_BENCH_ONLY=postgres RING0_BENCH_POSTGRES_URL=$url \
        cargo bench -p ring0-journal --bench commit 2>/dev/null) | tee "$work/$how.out" >&2
    bash "$root/scripts/test-postgres.sh" stop "$dir" >/dev/null 2>&1
}

measure start-durable
measure start
echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for how in start-durable start; do
    grep -E '^journal commit benchmark|median of' "$work/$how.out"
done
