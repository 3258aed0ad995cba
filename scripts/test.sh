#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v script >/dev/null || need_apt+=(bsdutils)
command -v python3 >/dev/null || need_apt+=(python3)
# The sandbox and egress product tests drive real programs inside the sandbox.
command -v curl >/dev/null || need_apt+=(curl)
command -v git >/dev/null || need_apt+=(git)
# The web console's browser tests drive Debian's headless Chromium (at /usr/bin/chromium).
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if ((${#need_apt[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
# Real MCP peers (reference servers, Inspector CLI, conformance suite, Python SDK) for the
# gateway's interoperability tests; installed once into target/mcp-peers/.
bash scripts/install-mcp-peers.sh
# A throw-away PostgreSQL cluster for the PostgreSQL journal's tests (installed if missing),
# named to them by RING0_TEST_POSTGRES_URL and stopped when the tests end.
pg_dir=$(mktemp -d /tmp/ring0-test-postgres.XXXXXX)
trap 'bash scripts/test-postgres.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
eval "$(bash scripts/test-postgres.sh start "$pg_dir")"

cargo test --workspace --doc --quiet
cargo nextest run --workspace --no-fail-fast --cargo-quiet
# The Python package `ring0` (crates/py, python/): built with maturin into a venv under target/,
# tested with pytest, its adapters with the real frameworks (no LLM).
bash scripts/test-python.sh
