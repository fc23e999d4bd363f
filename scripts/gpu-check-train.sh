#!/usr/bin/env bash
# The `train` step of scripts/gpu-check.sh: `leo train` in one CPU process (the reference
# kernels), on one GPU, and with GPUS >= 2 on two (NCCL) in pipeline.mode leo (with the cache
# plan), blocking (no cache) and fine-grained reading every remote row in place from the peer
# GPU (pipeline.transport=shared-memory: symmetric memory, comm/row_areas.py), float64, 5
# epochs; then gpu_check_report.py compares every GPU run's loss curve with the CPU one
# (OUT/exactness.json; the in-place run must also have read rows in place). Runs under
# OUT/train/.
#
#   scripts/gpu-check-train.sh OUT_DIR [GPUS]
set -euo pipefail
cd "$(dirname "$0")/.."
out="$1"
gpus="${2:-1}"
rm -rf "$out/train"
export LEO_HARDWARE_CACHE="$out/train/hardware"  # the cache plan's probe, not ~/.cache

train() {  # train RUN PARTS MODE POLICY DEVICE [TRANSPORT]; on cpu the reference kernels
  local kernels=cuda
  [[ $5 == cpu ]] && kernels=ref
  echo "-- leo train: $1 ($2 x $5, pipeline.mode=$3, cache.policy=$4, transport ${6:-auto})"
  LEO_KERNELS=$kernels .venv/bin/leo train --set "run.out_dir=$out/train/$1" --set "partition.num_parts=$2" \
    --set "pipeline.mode=$3" --set "cache.policy=$4" --set "launch.device=$5" \
    --set "pipeline.transport=${6:-auto}" \
    --set train.dtype=float64 --set train.num_epochs=5 --set train.eval_every=5
}

train cpu 1 blocking none cpu
train p1 1 blocking none cuda
runs=("$out/train/p1")
status=0
if ((gpus >= 2)); then
  train p2-leo 2 leo leo cuda
  train p2-blocking 2 blocking none cuda
  train p2-peer 2 fine-grained leo cuda shared-memory || status=$?  # compared even if it fails
  runs+=("$out/train/p2-leo" "$out/train/p2-blocking" "$out/train/p2-peer")
fi
python3 scripts/gpu_check_report.py compare "$out" "$out/train/cpu" "${runs[@]}" || status=$?
exit "$status"
