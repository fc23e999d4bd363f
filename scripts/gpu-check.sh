#!/usr/bin/env bash
# Everything that needs a GPU, as one prepared run that fits a 10-minute device slot
# (`make test-gpu`). Steps, each with its own time cap inside an overall budget:
#
#   env      .venv must hold a CUDA build of torch. When it does, nothing is installed and no
#            package registry is needed; only a .venv without one runs `make install`.
#   compile  `leo compile` for the visible GPUs' architectures (cached when unchanged).
#   tests    the GPU tests: tests/kernels -m "gpu or cuda_ext" with LEO_KERNELS=cuda (a library
#            that does not load fails here instead of skipping them).
#   train    `leo train` on one GPU and, with two GPUs or more, on 2 GPUs (NCCL) in
#            pipeline.mode leo (cache plan), blocking (no cache) and fine-grained reading the
#            peer GPU's rows in place (pipeline.transport=shared-memory), against one CPU
#            process; float64 loss curves must agree to 1e-9 relative, every GPU run must say
#            exact and name the cuda kernels, and the in-place run must have read rows in place.
#   bench    the kernel bandwidth benchmark (python -m leo_cli.kernel_tools.bench_gpu).
#
# Logs, env.json, exactness.json, bench_gpu.json and summary.json (every step's status and
# seconds, the GPU test counts, the exactness and bench results) land in OUT_DIR. Exits non-zero
# when a step failed or ran out of time. Expected on one H200 with 16 cores: ~4-7 minutes.
#
#   scripts/gpu-check.sh [OUT_DIR]      # default gpu-check; GPU_CHECK_BUDGET_S (default 560)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
mkdir -p "$out"
rm -f "$out/steps.jsonl" "$out/summary.json" "$out/exactness.json" "$out/bench_gpu.json"
report=(python3 scripts/gpu_check_report.py)
budget="${GPU_CHECK_BUDGET_S:-560}"
py=.venv/bin/python

# Seconds a step may take: its own cap, or what is left of the budget (10 s kept to summarise).
allowance() {
  local left=$((budget - SECONDS - 10))
  ((left < $1)) && echo $((left > 0 ? left : 1)) || echo "$1"
}

# run_step NAME CAP LOG COMMAND...: run under `timeout`, log to OUT/LOG, record the outcome.
run_step() {
  local name=$1 cap log=$3 t0=$SECONDS status=ok code
  cap=$(allowance "$2")
  shift 3
  echo "== $name (up to ${cap} s, log $out/$log)"
  timeout "$cap" "$@" >"$out/$log" 2>&1
  code=$?
  ((code == 124)) && status=timeout
  ((code != 0 && code != 124)) && status=fail
  tail -n 5 "$out/$log"
  "${report[@]}" record "$out" "$name" "$status" $((SECONDS - t0)) "exit $code"
  return "$code"
}

finish() {
  "${report[@]}" summarize "$out"
  exit $?
}

ENV_PROBE='import json, torch, leo_cli
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
  "gpus": torch.cuda.device_count(),
  "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))'

probe_env() { "$py" -c "$ENV_PROBE" >"$out/env.json" 2>"$out/env.log"; }

# --- env: no registry once .venv has a CUDA torch --------------------------------------------
t0=$SECONDS
if probe_env && [[ -n "$("${report[@]}" get "$out/env.json" cuda)" ]]; then
  echo "== env: .venv has a CUDA build of torch; nothing to install"
else
  echo "== env: .venv has no CUDA build of torch yet: make install (needs the package registry)"
  make install >"$out/install.log" 2>&1 && probe_env
fi
cuda=$("${report[@]}" get "$out/env.json" cuda 2>/dev/null)
gpus=$("${report[@]}" get "$out/env.json" gpus 2>/dev/null)
if [[ -z "$cuda" ]]; then
  "${report[@]}" record "$out" env fail $((SECONDS - t0)) "no CUDA build of torch in .venv"
  finish
fi
if [[ -z "$gpus" || "$gpus" == 0 ]]; then
  "${report[@]}" record "$out" env fail $((SECONDS - t0)) "no CUDA device visible"
  finish
fi
"${report[@]}" record "$out" env ok $((SECONDS - t0)) "torch CUDA $cuda, $gpus GPU(s)"

# --- compile, then the GPU tests ---------------------------------------------------------------
if ! run_step compile 240 compile.log .venv/bin/leo compile; then
  finish  # nothing below runs without the library
fi
export LEO_KERNELS=cuda
run_step tests 200 pytest-gpu.log \
  .venv/bin/pytest -q -p no:cacheprovider -m "gpu or cuda_ext" -rs tests/kernels

# --- one GPU, and with two leo, blocking and rows read in place, against one CPU process ------
run_step train 240 train.log scripts/gpu-check-train.sh "$out" "$gpus"

# --- kernel bandwidth --------------------------------------------------------------------------
run_step bench 170 bench_gpu.log "$py" -m leo_cli.kernel_tools.bench_gpu --json "$out/bench_gpu.json"
finish
