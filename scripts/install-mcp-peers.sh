#!/usr/bin/env bash
# Installs the MCP peers that ring0's interoperability tests, conformance run and gateway
# benchmark talk to, into a project-local directory (default target/mcp-peers/, ignored by git; or $MCP_PEERS_DIR):
#   node/   npm packages: the reference servers, the Inspector CLI, the conformance suite,
#           Node 22 (the `node` package) for the tools that need it, and playwright-core (it
#           drives Debian's headless `chromium` for the web console's tests; no browser download);
#   py/     a venv with the Python MCP SDK (client and fixture servers);
#   proxy/  a venv with mcp-proxy (the benchmark's comparison point), kept apart so its own
#           dependency ranges cannot move the SDK version the tests use;
#   schemathesis/  a venv with schemathesis, which the agent API's test runs against
#           /v1/openapi.json (kept apart for the same reason).
# Idempotent: a finished install is recorded in $DIR/.installed-<version> and skipped next time.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${MCP_PEERS_DIR:-$PWD/target/mcp-peers}"
STAMP="$DIR/.installed-5"
if [[ -f "$STAMP" ]]; then
    exit 0
fi

need_apt=()
command -v npm >/dev/null || need_apt+=(npm)
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi

mkdir -p "$DIR/node"
npm install --prefix "$DIR/node" --no-audit --no-fund --loglevel=error \
    @modelcontextprotocol/server-everything@2026.8.31 \
    @modelcontextprotocol/server-filesystem@2026.8.31 \
    @modelcontextprotocol/inspector@2.12.0 \
    @modelcontextprotocol/conformance@0.1.16 \
    playwright-core@1.65.2 \
    node@22

python3 -m venv "$DIR/py"
"$DIR/py/bin/pip" install --quiet --disable-pip-version-check "mcp==2.3.*"
python3 -m venv "$DIR/proxy"
"$DIR/proxy/bin/pip" install --quiet --disable-pip-version-check "mcp-proxy==0.13.0"
python3 -m venv "$DIR/schemathesis"
"$DIR/schemathesis/bin/pip" install --quiet --disable-pip-version-check "schemathesis==4.32.5"

"$DIR/node/node_modules/.bin/node" --version >/dev/null
touch "$STAMP"
echo "MCP peers installed in $DIR"
