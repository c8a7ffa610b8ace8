#!/usr/bin/env bash
# Runs the CPU test suite against the newest Triton release on PyPI, in its own venv
# (.venv-newest-triton), beside the tested one (.venv). Extra arguments go to pytest.
# The result of the last run is recorded in docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
venv=.venv-newest-triton
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==${KV_CANARY_TORCH:-2.13.0}"
"$venv/bin/python" -m pip install -q --upgrade triton numpy
"$venv/bin/python" -m pip install -q -e '.[test,bench,demo]'
"$venv/bin/python" -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
