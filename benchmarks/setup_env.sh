#!/usr/bin/env bash
# Build benchmarks/.venv: our package plus the peers it is measured against, never the
# package's own dependencies. Idempotent: a finished environment is left as it is.
#   bash benchmarks/setup_env.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="$HERE/.venv"
STAMP="$VENV/.bench-stamp"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q -c "$HERE/constraints.txt")

if [[ -f "$STAMP" && "$STAMP" -nt "$HERE/setup_env.sh" && "$STAMP" -nt "$ROOT/pyproject.toml" ]]; then
  exit 0
fi
test -x "$PY" || "${PYTHON:-python3}" -m venv "$VENV"
# torch first, from the local CPU wheel; everything after is held to it by constraints.txt.
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -e "$ROOT"
# litdata and mosaicml-streaming both require torchvision, whose wheel pins a CUDA torch:
# install them without dependencies, then the dependencies they import (torchvision left
# out; benchmarks/stubs/torchvision stands in for mosaic's import-time use).
"${PIP[@]}" --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0
"${PIP[@]}" lightning-utilities filelock boto3 requests tifffile obstore \
  "xxhash<4" zstd python-snappy Brotli tqdm catalogue "transformers<5" matplotlib pillow
# the object-store rows (targets12.py) read from a local S3-compatible server
"${PIP[@]}" "moto[server]>=5.1"
PYTHONPATH="$HERE/stubs" "$PY" -c "import litdata, streaming, lancedb, lance, loader, matplotlib, moto, PIL"
touch "$STAMP"
