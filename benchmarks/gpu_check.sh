#!/usr/bin/env bash
# Rows/s the loader delivers to an NVIDIA GPU (pin_memory + non-blocking copies) against the
# step time of a small model, one rank over NCCL, and the input-to-device time of packed token
# batches with pinned and with pageable memory. Under 5 minutes; needs a CUDA build of torch.
# Without a GPU (or without a CUDA torch) it exits 2 and says why.
#   bash benchmarks/gpu_check.sh                # w=0 then w=4, 1M rows of 528 B
#   PYTHON=/path/to/python ROWS=500000 bash benchmarks/gpu_check.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"
fail() { echo "gpu_check: $*" >&2; exit 2; }

command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this check needs an NVIDIA GPU and driver"
nvidia-smi -L || fail "nvidia-smi sees no GPU"
test -x "$PY" || fail "no Python at $PY (set PYTHON=...)"
"$PY" - <<'PYCHECK' || fail "torch here cannot use the GPU (install a CUDA build: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128)"
import sys, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs: {torch.cuda.device_count()}")
sys.exit(0 if torch.cuda.is_available() and torch.distributed.is_nccl_available() else 1)
PYCHECK
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" NUMBA_THREADING_LAYER=workqueue
mkdir -p "$HERE/out"
for workers in 0 ${WORKERS:-4}; do
  timeout 200 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    "$HERE/gpu_check.py" --rows "${ROWS:-1000000}" --workers "$workers" --seconds "${SECONDS_EACH:-15}" \
    | tee "$HERE/out/gpu_check-w$workers.json"
done
