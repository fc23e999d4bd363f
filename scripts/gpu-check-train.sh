#!/usr/bin/env bash
# The `train` step of scripts/gpu-check.sh: `leo train` on one GPU, then on two (NCCL) in
# pipeline.mode leo (with the cache plan), blocking (no cache) and fine-grained reading every
# remote row in place from the peer GPU (pipeline.transport=shared-memory: symmetric memory,
# comm/row_areas.py), float64, 5 epochs; then gpu_check_report.py compares the loss curves
# (OUT/exactness.json; the in-place run must also have read rows in place). Runs under
# OUT/train/.
#
#   scripts/gpu-check-train.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out="$1"
rm -rf "$out/train"
export LEO_HARDWARE_CACHE="$out/train/hardware"  # the cache plan's probe, not ~/.cache

train() {  # train RUN PARTS MODE POLICY [TRANSPORT]
  echo "-- leo train: $1 ($2 GPU(s), pipeline.mode=$3, cache.policy=$4, transport ${5:-auto})"
  .venv/bin/leo train --set "run.out_dir=$out/train/$1" --set "partition.num_parts=$2" \
    --set "pipeline.mode=$3" --set "cache.policy=$4" --set launch.device=cuda \
    --set "pipeline.transport=${5:-auto}" \
    --set train.dtype=float64 --set train.num_epochs=5 --set train.eval_every=5
}

train p1 1 blocking none
train p2-leo 2 leo leo
train p2-blocking 2 blocking none
status=0
train p2-peer 2 fine-grained leo shared-memory || status=$?  # compared even when this one fails
python3 scripts/gpu_check_report.py compare "$out" "$out/train/p1" \
  "$out/train/p2-leo" "$out/train/p2-blocking" "$out/train/p2-peer"
exit "$status"
