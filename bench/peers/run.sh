#!/usr/bin/env bash
# Measures the per-call overhead of LangGraph's ToolNode and the OpenAI Agents SDK's function
# tools on a no-op tool, runs ring0's `mediation` bench on the same tool and schema, measures
# ring0's Python package (`Session.handle_turn` with the tool as a Python function, the kernel in
# process) in the same run, and prints ring0's overhead as a fraction of each peer's and whether
# the targets hold.
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
    grep -iE '^(langgraph|langchain-core|openai-agents|pydantic|maturin) '

# ring0's Python package, built from this tree (release) and installed as a wheel.
(cd "$root" && "$venv/bin/maturin" build --release --locked --quiet --out "$venv/wheels")
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "$(ls -t "$venv"/wheels/ring0-*.whl | head -1)"

results="$venv/results"
mkdir -p "$results"

echo
"$venv/bin/python" "$here/langgraph_toolnode.py" | tee "$results/langgraph.txt"
echo
"$venv/bin/python" "$here/agents_function_tool.py" | tee "$results/openai_agents.txt"
echo
# Run from the bench directory, so `ring0` is the installed wheel, not the source tree's.
(cd "$here" && "$venv/bin/python" "$here/ring0_python.py") | tee "$results/ring0_python.txt"
echo
(cd "$root" && cargo bench -p ring0-kernel --bench mediation) | tee "$results/ring0.txt"

"$venv/bin/python" "$here/compare.py" "$results/langgraph.txt" "$results/openai_agents.txt" \
    "$results/ring0.txt" "$results/ring0_python.txt" | tee "$results/comparison.txt"
