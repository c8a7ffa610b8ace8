#!/usr/bin/env bash
# Creates .venv (Python 3.10+) and installs this package with its test, bench and demo extras.
# Re-running is a no-op once installed. Three worlds, each checked with
# `pip install --isolated --dry-run` (README, "Two commands"):
#
# 1. torch and Triton already importable by $PYTHON (a GPU machine's image): the venv sees
#    them (--system-site-packages) and a constraints file pins their installed versions, so
#    nothing replaces them; offline, the package goes in without its dependencies.
# 2. Otherwise torch 2.13.0 goes in first, alone: where pip finds a local CPU wheel of it
#    (this project's development machines) it takes that; on plain PyPI it takes the CUDA
#    build, which brings the Triton release it pins (3.7.1). Asking for torch and a Triton
#    in one command fails there (ResolutionImpossible): torch 2.13.0 from PyPI pins Triton.
# 3. Only when torch brought no Triton: Triton 3.6.0, with numpy < 2.4 (3.6's interpreter
#    converts arrays the way numpy 2.4 removed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${KV_CANARY_TORCH:-2.13.0}"
TRITON_VERSION="${KV_CANARY_TRITON:-3.6.0}"
stamp=".venv/.kv-canary-installed"
want="$(cat pyproject.toml scripts/setup-venv.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
pin_installed() {  # pin whatever torch / triton the venv has now
  .venv/bin/python - "$constraints" <<'EOF'
import importlib.metadata as md
import sys

lines = []
for name in ("torch", "triton"):
    try:
        lines.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
try:
    if md.version("triton").startswith("3.6."):
        lines.append("numpy<2.4")
except md.PackageNotFoundError:
    pass
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
}

if "$PYTHON" -c "import torch, triton" 2>/dev/null; then
  # World 1: keep the machine's torch and Triton.
  [ -x .venv/bin/python ] || "$PYTHON" -m venv --system-site-packages .venv
  pin_installed
  if ! .venv/bin/python -m pip install -q --no-build-isolation -c "$constraints" \
      -e '.[test,bench,demo]'; then
    echo "setup-venv: could not install the extras (offline?); installing the package alone" >&2
    .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
  fi
else
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==$TORCH_VERSION"          # world 2
  if ! .venv/bin/python -c "import triton" 2>/dev/null; then
    .venv/bin/python -m pip install -q "triton==$TRITON_VERSION"       # world 3
  fi
  pin_installed
  .venv/bin/python -m pip install -q -c "$constraints" -e '.[test,bench,demo]'
fi
echo "$want" > "$stamp"
