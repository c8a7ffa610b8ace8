#!/usr/bin/env bash
# Downloads the cp312 wheels that SGLang 0.5.23's CUDA kv-canary kernels need on the GPU
# machine (benchmarks/sglang/run_cuda_differential.py) into .whl/ (git-ignored): sglang
# 0.5.23 itself, apache-tvm-ffi 0.1.11 (its JIT loader) and msgspec 0.23.0 (its build cache). None
# of their other dependencies: the script imports only sglang.kernels.ops.kv_canary and
# what it needs. There: pip install --no-index --no-deps --target /tmp/site .whl/*.whl and
# PYTHONPATH=/tmp/site (docs of the device machine). Prints each wheel and the total size.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DEST="${DEST:-.whl}"
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_24_x86_64; do
  platforms+=(--platform "$p")
done
for req in sglang==0.5.23 apache-tvm-ffi==0.1.11 msgspec==0.23.0; do
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DEST" "$req"
done
# Keep one version of each (two stop the install there).
for name in sglang apache_tvm_ffi msgspec; do
  n=$(ls "$DEST"/${name}-*.whl 2>/dev/null | wc -l)
  if [ "$n" -ne 1 ]; then
    echo "download-sglang-wheels: $DEST holds $n wheels of $name; keep one" >&2
    exit 1
  fi
done
ls -l "$DEST"/sglang-*.whl "$DEST"/apache_tvm_ffi-*.whl "$DEST"/msgspec-*.whl
du -cb "$DEST"/sglang-*.whl "$DEST"/apache_tvm_ffi-*.whl "$DEST"/msgspec-*.whl | tail -1 |
  awk '{printf "download-sglang-wheels: %.1f MB together (a device call carries at most 64 MiB)\n", $1 / 1e6}'
