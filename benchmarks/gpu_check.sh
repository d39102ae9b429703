#!/usr/bin/env bash
# The dispatch check on a GPU machine, in under 8 minutes (each stage has its own timeout):
#   1. the CUDA jax that matches the pins (jax[cuda12]==0.10.2) and the `gpu` extra (tokamax),
#   2. the dispatch parity tests on the GPU (float32 matmuls at full precision: TF32 would
#      fail the float64 reference's tolerances for reasons unrelated to dispatch),
#   3. benchmarks/dispatch_bench.py at 137m, batch 8x1024, bfloat16, the study's remat
#      (full): tokens/s, MFU and compiled memory per dispatcher, saved to
#      benchmarks/results/dispatch_gpu.json; commit that file and set AUTO_DISPATCH["gpu"]
#      to the `fastest_dropless` entry it prints (tests/test_dispatch.py then checks it).
#
#   bash benchmarks/gpu_check.sh            # from anywhere; uses .venv (scripts/setup.sh makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || timeout 240 bash scripts/setup.sh

stage() { echo "== $1 ($(date +%T))"; }

stage "install CUDA jax matching the pins + the gpu extra"
JAX_PIN=$(sed -n 's/^jax==\(.*\)$/\1/p' requirements.lock)
timeout 240 "$PY" -m pip install -q "jax[cuda12]==${JAX_PIN}" "jaxlib==${JAX_PIN}"
timeout 60 "$PY" -m pip install -q -r requirements-gpu.lock
"$PY" - <<'EOF'
import jax, tokamax
assert jax.default_backend() == "gpu", f"no GPU backend: {jax.devices()}"
print(f"jax {jax.__version__}, tokamax {tokamax.__version__}, {jax.devices()}")
EOF

stage "dispatch parity tests on the GPU"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 120 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_dispatch.py

stage "dispatch_bench 137m 8x1024 bfloat16"
timeout 300 "$PY" benchmarks/dispatch_bench.py --size 137m --batch 8 --dtype bfloat16 --remat full \
  --steps 5 --rounds 2 --block_sizes 128,256 --save | tee /tmp/gpu_dispatch_bench.log
stage "done: commit benchmarks/results/dispatch_gpu.json and the AUTO_DISPATCH[\"gpu\"] it names"
