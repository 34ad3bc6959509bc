#!/usr/bin/env bash
# One prepared GPU session (the `device` tool): the CUDA tests, then the benchmarks on CUDA.
# Results land in $OUT (default benchmarks/results/gpu); commit them to benchmarks/results/.
# Budget: about 8 minutes on an H200 once the venv exists; every step has its own timeout so
# a slow one cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
PY=${PY:-.venv/bin/python}
if ! $PY -c "import dtg_gpu" 2>/dev/null; then
  python3 -m venv .venv && .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1 && .venv/bin/pip install -q -e '.[test]'
fi
{ nvidia-smi; $PY -c "import sys; from dtg_gpu.cli.main import main; sys.exit(main(['env']))"; } > "$OUT/machine.txt" 2>&1
# the device fixture runs every engine test on cuda too when CUDA is present
timeout 240 $PY -m pytest -q -x tests/test_analysis.py tests/test_centrality.py tests/test_graph.py \
  tests/test_grouped.py -p no:cacheprovider > "$OUT/tests_cuda.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests_cuda.txt"
timeout 300 $PY benchmarks/bench_centrality.py --device cuda --out "$OUT" > "$OUT/bench_centrality.log" 2>&1
timeout 120 $PY benchmarks/bench_pipeline.py --quick --device cuda --out "$OUT" > "$OUT/bench_pipeline.log" 2>&1
timeout 120 $PY benchmarks/bench_sweep.py --device cuda --out "$OUT" > "$OUT/bench_sweep.log" 2>&1
ls -l "$OUT"
