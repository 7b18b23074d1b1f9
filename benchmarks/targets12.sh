#!/usr/bin/env bash
# Issue #12's benchmark rows in one command: reads in flight on the local S3 server with
# injected latency (0/10/50 ms), their peak memory, and ours vs lance.torch on local disk.
#   bash benchmarks/targets12.sh                 # 3 repetitions
#   REPS=5 ROWS=2000000 bash benchmarks/targets12.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$HERE/.venv/bin/python"
export NUMBA_THREADING_LAYER="${NUMBA_THREADING_LAYER:-workqueue}"
export PYTHONPATH="$(dirname "$HERE"):$HERE/stubs:$HERE"

bash "$HERE/setup_env.sh"
"$PY" -c "import sys; sys.path.insert(0, '$HERE'); import build_data as b; \
  from common import LANCEDB_URI; LANCEDB_URI.exists() or b.build_lancedb(${ROWS:-2000000}, 0)"
"$PY" "$HERE/targets12.py" --reps "${REPS:-3}"
cp "$HERE/out/targets12.md" "$HERE/targets12.md"
if [[ -f "$HERE/out/targets12.png" ]]; then cp "$HERE/out/targets12.png" "$HERE/targets12.png"; fi
