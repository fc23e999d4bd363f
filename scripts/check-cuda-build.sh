#!/usr/bin/env bash
# `make check-cuda-build`: compile AND link leo_cli._C for real on a machine without a GPU.
#
# `leo compile --check` compiles the kernels with nvcc and only syntax-checks the torch binding
# against the CPU torch of .venv. This runs the real `leo compile` (torch's CUDAExtension: nvcc,
# the host compiler, and the link against libtorch_cuda) with the CUDA build of torch in VENV
# (default .venv-cuda, made by the Makefile target), then imports the library with
# LEO_KERNELS=cuda: every symbol must resolve and all four kernels must register against the op
# schemas of leo_cli/kernels/ops.py. Nothing is launched, so no GPU is needed.
#
# It builds in a copy of leo_cli/ and cuda/ under build/cuda-build-check/, so the library never
# lands in the checkout's package, where the CPU .venv would find a library built for another
# torch. Compiler warnings in our sources fail the check.
#
#   scripts/check-cuda-build.sh [VENV]      # log: build/cuda-build-check/build.log
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-cuda}"
py="$PWD/$venv/bin/python"
work="$PWD/build/cuda-build-check"
tree="$work/tree"
test -x "$py" || { echo "check-cuda-build: no $venv (make check-cuda-build creates it)"; exit 1; }

rm -rf "$tree"
mkdir -p "$tree"
cp -r leo_cli cuda "$tree/"
rm -f "$tree"/leo_cli/_C*.so "$tree/leo_cli/_C.stamp.json"
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
export PYTHONPATH="$tree"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"

torch_version=$("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)
echo "check-cuda-build: leo compile for $TORCH_CUDA_ARCH_LIST against torch $torch_version"
start=$SECONDS
if ! (cd "$tree" && "$py" -m leo_cli compile --force --verbose) >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log"
  echo "check-cuda-build: FAILED to build (log: $work/build.log)"
  exit 1
fi
echo "check-cuda-build: compiled and linked in $((SECONDS - start)) s (log: $work/build.log)"

# Warnings that point into our sources (torch's own headers are not ours to fix).
if grep -n "warning" "$work/build.log" | grep -F "$tree/cuda/"; then
  echo "check-cuda-build: FAILED: compiler warnings in cuda/ (above)"
  exit 1
fi

cd "$tree"  # the copy's leo_cli first on sys.path, not the checkout's
LEO_KERNELS=cuda "$py" - "$tree" <<'EOF'
"""Load the library the way training does and name what it registered."""
import sys
from pathlib import Path

import torch

import leo_cli
from leo_cli import kernels

tree = Path(sys.argv[1]).resolve()
assert Path(leo_cli.__file__).resolve().is_relative_to(tree), leo_cli.__file__
backend = kernels.active_backend()  # LEO_KERNELS=cuda: raises unless it loads and registers
import leo_cli._C as ext

assert backend.name == "cuda", backend
ops = ["spmm_csr", "fused_aggregate", "gather_rows", "scatter_add_rows"]
for op in ops:
    table = torch._C._dispatch_dump(f"leo::{op}")
    assert "CUDA: registered at" in table and "leo_binding.cpp" in table, table
size = Path(ext.__file__).stat().st_size / 1e6
print(f"check-cuda-build: {Path(ext.__file__).name} ({size:.1f} MB) loads; CUDA kernels of "
      f"{', '.join(ops)} registered (GPU visible: {torch.cuda.is_available()})")
EOF
