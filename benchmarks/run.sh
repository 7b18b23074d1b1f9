#!/usr/bin/env bash
# The one benchmark command (`make bench`): environment, tables, every loader side by side,
# the ratio table and the plot, and the plan benchmark.
#   bash benchmarks/run.sh                 # 2M rows, 3 repetitions
#   ROWS=500000 REPS=5 bash benchmarks/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$HERE/.venv/bin/python"
export PYTHONPATH="$HERE/stubs:$HERE"
export NUMBA_THREADING_LAYER="${NUMBA_THREADING_LAYER:-workqueue}"

bash "$HERE/setup_env.sh"
"$PY" "$HERE/build_data.py" --rows "${ROWS:-2000000}"
"$PY" "$HERE/run.py" --reps "${REPS:-3}"
"$PY" "$HERE/report.py" | tee "$HERE/out/report.md"
if [[ "${PLAN:-1}" == 1 ]]; then
  "$PY" "$HERE/plan.py" | tee "$HERE/out/plan.md"
fi
echo "plot: $HERE/out/rows_per_s.png"
