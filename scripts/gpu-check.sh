#!/usr/bin/env bash
# Everything that needs a GPU, as one script: build the CUDA kernels, run the GPU tests
# (parity with the reference, opcheck, hub rows, peer/host remote rows) and the kernel
# benchmark (bandwidth per kernel as a fraction of the device's copy bandwidth, uniform and
# power-law graphs). Needs a CUDA build of torch in .venv (see README, "Kernels").
#
#   scripts/gpu-check.sh [OUT_DIR]    # logs and bench_gpu.json land in OUT_DIR (default: gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
mkdir -p "$out"
make install
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'"
.venv/bin/leo compile 2>&1 | tee "$out/compile.log"
status=0
# LEO_KERNELS=cuda: a build that does not load fails here instead of skipping the GPU tests.
export LEO_KERNELS=cuda
.venv/bin/pytest -q -m "gpu or cuda_ext" -rs tests/kernels 2>&1 | tee "$out/pytest-gpu.log" || status=$?
.venv/bin/python -m leo_cli.kernels.bench_gpu --json "$out/bench_gpu.json" 2>&1 \
  | tee "$out/bench_gpu.log" || status=$?
exit "$status"
