#!/usr/bin/env bash
# The Python package `ring0`: builds it with maturin into a virtual environment under target/,
# with pytest and the frameworks its adapters wrap (pinned in python/requirements-test.txt and
# python/constraints.txt), and runs its tests (python/tests). The Client's tests drive a real
# `ring0 serve --http`, built here and named to them by RING0_BIN.
#
#   bash scripts/test-python.sh [PYTEST ARGS...]
#
# The environment is installed once per change of the pinned files (a stamp in it says which);
# the extension is rebuilt by cargo's own change tracking. PYTHON names the interpreter (3.10+).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv="$root/target/python-venv"
python=${PYTHON:-python3}

"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "python 3.10 or newer is needed")'
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
want=$(cat python/requirements-test.txt python/constraints.txt | sha256sum | cut -c1-16)
stamp="$venv/.ring0-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r python/requirements-test.txt -c python/constraints.txt
    echo "$want" >"$stamp"
fi

# The package, built from this tree into the environment (debug: the tests do not time it).
VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --quiet --locked
"$venv/bin/python" -c 'import ring0, ring0._ring0' # fails loudly if the build did not install

cargo build --quiet -p ring0
export RING0_BIN="$root/target/debug/ring0"
cd python
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
