#!/usr/bin/env bash
# The tests: set up .venv if needed, then run pytest. Without CUDA the Triton kernels run
# in Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python -m pytest -q "$@"
