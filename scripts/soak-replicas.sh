#!/usr/bin/env bash
# A long soak of the replica kill test: three `ring0 serve --http` replicas on one PostgreSQL
# journal behind a round-robin proxy, SIGKILLed at random and restarted while Python MCP SDK
# clients make keyed mutating calls, PostgreSQL restarted once mid-run; every call must be
# answered with exactly one effect (crates/cli/tests/replicas_kill.rs).
#
#   bash scripts/soak-replicas.sh            # 300 kills a run, 1 run
#   KILLS=1000 RUNS=5 bash scripts/soak-replicas.sh
#
# Starts the shared test database itself when RING0_TEST_POSTGRES_URL is not set (the test
# restarts a cluster of its own beside it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kills=${KILLS:-300}
runs=${RUNS:-1}
cd "$root"
if [ -z "${RING0_TEST_POSTGRES_URL:-}" ]; then
    pg=$(mktemp -d)
    chmod 755 "$pg"
    trap 'bash "$root/scripts/test-postgres.sh" stop "$pg/cluster" >/dev/null 2>&1 || true' EXIT
    eval "$(bash scripts/test-postgres.sh start "$pg/cluster")"
fi
for run in $(seq 1 "$runs"); do
    echo "soak run $run of $runs: $kills kills" >&2
    RING0_REPLICA_KILLS=$kills cargo test -p ring0 --test replicas_kill -- --nocapture
done
