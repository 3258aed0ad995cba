#!/usr/bin/env bash
# Measures the per-call overhead of LangGraph's ToolNode and the OpenAI Agents SDK's function
# tools on a no-op tool, runs ring0's `mediation` bench on the same tool and schema, and prints
# ring0's overhead as a fraction of each peer's and whether the target (at most 1/20 of the
# fastest peer) holds.
#
#   bench/peers/run.sh
#
# Needs python3 (3.10 or newer, with venv) and network access to the package registry pip uses; the
# peers are installed into bench/peers/.venv at the versions pinned in requirements.txt.
# Figures and the comparison are printed, and kept in bench/peers/.venv/results/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv="$here/.venv"
python=${PYTHON:-python3}

"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "python 3.10 or newer is needed")'
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null |
    grep -iE '^(langgraph|langchain-core|openai-agents|pydantic) '

results="$venv/results"
mkdir -p "$results"

echo
"$venv/bin/python" "$here/langgraph_toolnode.py" | tee "$results/langgraph.txt"
echo
"$venv/bin/python" "$here/agents_function_tool.py" | tee "$results/openai_agents.txt"
echo
(cd "$root" && cargo bench -p ring0-kernel --bench mediation) | tee "$results/ring0.txt"

"$venv/bin/python" "$here/compare.py" "$results/langgraph.txt" "$results/openai_agents.txt" \
    "$results/ring0.txt" | tee "$results/comparison.txt"
