#!/usr/bin/env bash
# One prepared GPU session (the `device` tool): the CUDA tests, then the benchmarks on CUDA.
# Results land in $OUT (default benchmarks/results/gpu); commit them to benchmarks/results/.
# Budget: at most 570 s of timeouts on an H200 (run it with timeout_s=600); every step has its own
# timeout so a slow one cannot eat the others' time, and every benchmark saves as it goes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
# The lent H200 has no network but its image's python3 holds torch, torch-geometric, networkx,
# scipy, scikit-learn, safetensors, matplotlib, tqdm and pytest (device/KINDS.md): use it with
# the working tree on PYTHONPATH rather than a venv that could not be installed there.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
$PY -c "import dtg_gpu, torch; print('dtg_gpu ok, torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  > "$OUT/import.txt" 2>&1 || { cat "$OUT/import.txt"; exit 1; }
{ nvidia-smi; $PY -c "import sys; from dtg_gpu.cli.main import main; sys.exit(main(['env']))"; } > "$OUT/machine.txt" 2>&1
# the device fixture runs every engine test on cuda too when CUDA is present
timeout 120 $PY -m pytest -q -x tests/test_analysis.py tests/test_centrality.py tests/graph/test_operators.py \
  tests/graph/test_bipartite.py tests/sweeps/test_grouped.py -p no:cacheprovider > "$OUT/tests_cuda.txt" 2>&1
echo "tests rc=$?" >> "$OUT/tests_cuda.txt"
# the targets first (CIFAR VGG-16 at T=50, torchvision VGG-11), NetworkX timed for 1 step and
# extrapolated; then the other models. Each run saves its JSON after every model.
timeout 140 $PY benchmarks/bench_centrality.py --device cuda --models cifar_vgg16 --nx-steps 1 \
  --out "$OUT/vgg16" > "$OUT/bench_centrality_vgg16.log" 2>&1
timeout 110 $PY benchmarks/bench_centrality.py --device cuda --models tv_vgg11 --timesteps 1 10 --nx-steps 1 \
  --out "$OUT/tv_vgg11" > "$OUT/bench_centrality_tv_vgg11.log" 2>&1
timeout 80 $PY benchmarks/bench_centrality.py --device cuda --models lenet5 cifar_vgg11 resnet18 --nx-steps 1 \
  --out "$OUT/others" > "$OUT/bench_centrality_others.log" 2>&1
timeout 60 $PY benchmarks/bench_pipeline.py --quick --device cuda --out "$OUT" > "$OUT/bench_pipeline.log" 2>&1
timeout 60 $PY benchmarks/bench_sweep.py --device cuda --out "$OUT" > "$OUT/bench_sweep.log" 2>&1
ls -l "$OUT"
