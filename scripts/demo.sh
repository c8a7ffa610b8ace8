#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the engine-loop simulation.
# Extra arguments go to the demo (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python -m kv_canary_demo "$@"
