#!/usr/bin/env bash
# Creates .venv (Python 3.10+) with the CPU build of torch and Triton, and installs this
# package with its test extra. torch and triton go in one pip command: alone, pip would
# pull a multi-gigabyte CUDA build of torch. Re-running is a no-op once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
stamp=".venv/.kv-canary-installed"
want="$(cat pyproject.toml scripts/setup-venv.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0 triton==3.6.0 'numpy<2.4' -e '.[test,bench]'
echo "$want" > "$stamp"
