#!/usr/bin/env bash
# Every GPU check of the project in one run (use a 2-GPU machine for tests/launch/test_multi_gpu.py):
# GPU tests (those of torch.compile in a run of their own), compute-sanitizer memcheck of the
# plan and of write/verify, the demo on CUDA with corruption injected, and the benchmark of
# every stage. Writes run.log, memcheck-h200.log
# and the benchmark CSV and plots under $OUT (default: ./gpu-check-out).
# On two GPUs also benchmarks.probes.two_gpu_costs. BENCH=0 skips the benchmark (python -m benchmarks);
# CANARY=0 skips the canary contract tests on CUDA (the CPU suite runs them under the
# interpreter, where the write's PTX products and unrolled loop are not compiled).
# PARTS picks sections (default: tests canary memcheck demo compile bench; also suite, the
# whole suite in one process, sglang, SGLang's CUDA kernels side by side, and engines, the
# engines runtime on CUDA with the canary's share of a transformers step) so that a device call that must stay under a time limit can
# run a few of them. With .whl/sglang-*.whl present (scripts/download-sglang-wheels.sh), bench
# has SGLang's kernels as a column (--sglang require). Sections select test folders (docs/testing.md has the map).
# Usage: PYTHONPATH=. OUT=dir [BENCH=0] [CANARY=0] [PARTS="tests canary"] bash scripts/gpu-check.sh
set -o pipefail
PARTS=" ${PARTS:-tests canary memcheck demo compile bench} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
OUT="${OUT:-gpu-check-out}"
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/run.log
# The sources' digest beside the commit (a copied working tree may carry a stale .git), in
# C order: a glob's order follows the locale.
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null; echo "sources $(find kv_canary_buffers kv_canary_kernels kv_canary_demo -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16) engines $(find kv_canary_engines benchmarks -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > $L 2>&1
if part tests; then
echo "== GPU tests $(date -u +%T)" >> $L
timeout 400 python -m pytest -q tests/launch tests/plan tests/buffers tests/api tests/demo -p no:cacheprovider >> $L 2>&1; echo "pytest rc=$?" >> $L
fi
if [ "${CANARY:-1}" = 1 ] && part canary; then
  echo "== canary contract tests on CUDA $(date -u +%T)" >> $L
  # pytest-xdist where installed: the tests compile many write and verify variants, one
  # CPU core each (a write variant 3.5-10 s); the out-of-range property alone compiles
  # about 45 variants, 110-125 s for each of its three write tests on the H200 host.
  python -c "import xdist" 2>/dev/null && X="-n auto" || X=""
  timeout 420 python -m pytest -q $X tests/records -p no:cacheprovider >> $L 2>&1; echo "canary pytest rc=$?" >> $L
  timeout 30 python -m benchmarks.probes.write_chain_floor >> $L 2>&1; echo "write_chain_floor rc=$?" >> $L
fi
if part memcheck; then
echo "== memcheck $(date -u +%T)" >> $L
M=$OUT/memcheck-h200.log
timeout 100 compute-sanitizer --tool memcheck python scripts/memcheck/canary.py > $M 2>&1; echo "memcheck canary rc=$?" >> $L
timeout 200 compute-sanitizer --tool memcheck python scripts/memcheck/plan.py >> $M 2>&1; echo "memcheck plan rc=$?" >> $L
grep -E "ERROR SUMMARY|gpu_memcheck" $M >> $L
fi
if part demo; then
echo "== demo $(date -u +%T)" >> $L
timeout 60 python -m kv_canary_demo --device cuda --inject-corruption --steps 120 >> $L 2>&1; echo "demo rc=$?" >> $L
fi
if part demo && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  echo "== two GPUs: launch host cost, NCCL gather $(date -u +%T)" >> $L
  timeout 120 python -m benchmarks.probes.two_gpu_costs >> $L 2>&1; echo "two_gpu_costs rc=$?" >> $L
fi
if part compile; then
echo "== torch.compile tests $(date -u +%T)" >> $L
timeout 240 python -m pytest -q tests/compile -p no:cacheprovider >> $L 2>&1; echo "compile pytest rc=$?" >> $L
timeout 90 python -m benchmarks.probes.compiled_step_host >> $L 2>&1; echo "compiled_step_host rc=$?" >> $L
fi
if part sglang; then
  # SGLang 0.5.23's CUDA kernels beside this project's (byte-for-byte and GPU time): needs
  # the cp312 wheels of scripts/download-sglang-wheels.sh carried as .whl.
  echo "== SGLang's CUDA kernels $(date -u +%T)" >> $L
  if ls .whl/sglang-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/sglang-site .whl/*.whl >> $L 2>&1
    PYTHONPATH=/tmp/sglang-site:. timeout 400 python3 benchmarks/sglang/run_cuda_differential.py \
      --out $OUT/sglang-cuda.csv >> $L 2>&1; echo "sglang rc=$?" >> $L
  else
    echo "no .whl/sglang-*.whl: run scripts/download-sglang-wheels.sh and carry .whl" >> $L
  fi
fi
if part suite; then
  # The whole suite in one process (no test may depend on another's order or state).
  echo "== whole suite, one process $(date -u +%T)" >> $L
  timeout 590 python -m pytest -q tests -p no:cacheprovider >> $L 2>&1; echo "suite pytest rc=$?" >> $L
fi
if part engines; then
  # The engines runtime on CUDA: its GPU tests and the table load's (under memcheck too),
  # the runtime's host time against 29a5199's if a copy of it is carried as
  # .gpu/old/old_engines, the staging's parts, and the canary's share of a transformers
  # step (1B and 8B; transformers 5.17 is on the H200 image). About 6 minutes.
  echo "== engines on CUDA $(date -u +%T)" >> $L
  # (the runtime's tests take the CUDA device where there is one: its kernels compiled,
  # the table load's parts, the split write and the overlap on real streams; the engines
  # marker's need vLLM or the CPU machine's transformers, but for the gpu ones)
  timeout 240 python -m pytest -q -m "gpu or not engines" tests/engines \
    tests/launch/test_load_token_slots.py -p no:cacheprovider >> $L 2>&1
  echo "engines pytest rc=$?" >> $L
  timeout 150 compute-sanitizer --tool memcheck python -m pytest -q \
    tests/launch/test_load_token_slots.py -p no:cacheprovider > $OUT/memcheck-tables.log 2>&1
  echo "memcheck tables rc=$?" >> $L; grep -E "ERROR SUMMARY" $OUT/memcheck-tables.log >> $L
  if [ -d .gpu/old/old_engines ]; then
    PYTHONPATH=.gpu/old:. timeout 180 python -m benchmarks.probes.runtime_host --device cuda \
      --stages kernels --requests 13 --timing --module kv_canary_engines,old_engines >> $L 2>&1
    echo "runtime_host rc=$?" >> $L
  fi
  timeout 60 python -m benchmarks.probes.staging_parts >> $L 2>&1; echo "staging_parts rc=$?" >> $L
  timeout 300 python -m benchmarks.probes.engine_share --shapes 1b,8b --pairs 2 >> $L 2>&1
  echo "engine_share rc=$?" >> $L
fi
if [ "${BENCH:-1}" = 1 ] && part bench; then
  echo "== bench $(date -u +%T)" >> $L
  if ls .whl/sglang-*.whl >/dev/null 2>&1; then
    # SGLang's CUDA kernels as the sglang_cuda column (their nvcc JIT: a minute or two more).
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/sglang-site .whl/*.whl >> $L 2>&1
    PYTHONPATH=/tmp/sglang-site:. timeout 480 python -m benchmarks --quick --sglang require \
      --out $OUT >> $L 2>&1; echo "bench rc=$?" >> $L
  else
    timeout 240 python -m benchmarks --quick --out $OUT >> $L 2>&1; echo "bench rc=$?" >> $L
  fi
  # the split write: its stamp against launch_write, and its chain beside a GEMM (~30 s)
  timeout 120 python -m benchmarks.probes.write_split --quick >> $L 2>&1; echo "write_split rc=$?" >> $L
fi
echo "== done $(date -u +%T)" >> $L
