#!/usr/bin/env bash
# Lint: ruff's formatting and rules, then mypy, as configured in pyproject.toml. Sets up
# .venv if needed (ruff and mypy come with the test extra). CI runs it before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
for tool in ruff mypy; do
  if [ ! -x ".venv/bin/$tool" ]; then
    echo "lint: .venv has no $tool (pip install -e '.[test]' puts it there)" >&2
    exit 1
  fi
done
.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
