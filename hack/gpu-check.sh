#!/usr/bin/env bash
# The runtime's CUDA checks, for a session that is lent a GPU (CI never runs this): the gpu-marked tests
# (CPU/CUDA agreement, batching exact, batch-1 decode over contiguous KV blocks, int8/fp8 live) and the CUDA engine
# benchmark (decode at batch 1/8/32 against the HBM bound). Fits in 10 minutes: tests <= 6 min, benchmark <= 3 min.
# Results land in bench/results/engine_cuda.{json,md} and $OUT (when set) for the session to bring back.
#   hack/gpu-check.sh            (PYTHON=... to pick the interpreter; default .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/operator:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
status=0
timeout 360 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/runtime || status=$?
timeout 180 "$PY" -m bench.bench_engine_cuda --rounds 3 || status=$?
if [ -n "${OUT:-}" ]; then
    cp bench/results/engine_cuda.json bench/results/engine_cuda.md "$OUT"/ 2>/dev/null || true
fi
exit "$status"
