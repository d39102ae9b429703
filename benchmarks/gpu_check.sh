#!/usr/bin/env bash
# The dispatch check on the offline GPU machine, on its own python3 (jax 0.11.2 + CUDA 13
# plugin, flax, optax, orbax, numpy, pytest, hypothesis, ... preinstalled), in under 8 minutes.
# The packages it lacks travel as wheels in .whl (bash benchmarks/gpu_wheels.sh, run before,
# where PyPI is reachable); they are installed with pip --no-index --target, nothing else is
# fetched. Every result is written under $OUT as the check goes, so a timeout keeps what finished.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh            # the GPU machine (needs a GPU backend)
#   OUT=/some/dir bash benchmarks/gpu_check.sh --smoke    # the CPU rehearsal (benchmarks/gpu_rehearsal.sh)
#
# Stages (timeouts: 30 + 30 + 150 + 90 + 180 = 480 s):
#   0. install the carried wheels into a private folder (.whl -> $SITE);
#   1. the environment: versions, device, compute capability, dispatchers, numerics settings;
#   2. the dispatch parity tests (tests/test_dispatch.py) at `highest` matmul precision (TF32
#      would fail the float64 reference's tolerances for reasons unrelated to dispatch);
#   3. a bfloat16 parity check of every dispatcher against dense (dispatch_bench at smoke size,
#      compile and one step each, no timing);
#   4. dispatch_bench at 137m, 8x1024, bfloat16, remat full (--smoke: the smoke size): tokens/s,
#      MFU, compiled GiB and parity per dispatcher, the fastest dropless one, and whether its step
#      fits 8 GiB. Saved as $OUT/dispatch_gpu.json (the merged benchmarks/results file: commit it,
#      and set AUTO_DISPATCH["gpu"] to the `fastest_dropless` it names).
# Files under $OUT (8 at most come back): check.log, env.txt, tests.txt, parity_bf16.json,
# bench.json, dispatch_<backend>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $arg (use --smoke or nothing)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:?set OUT to the folder for the results}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/cacheable-moe-site}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
failed=0
# TIMEOUT_SCALE (default 1) stretches every stage's limit: only for a rehearsal on a loaded CPU.
T() { echo $(( $1 * ${TIMEOUT_SCALE:-1} )); }
stage() { echo "== stage $1 ($(date -u +%T)): $2"; }
verdict() {  # stage number, exit code
  if [ "$2" = 0 ]; then echo "== stage $1 passed"; else echo "== stage $1 FAILED (exit $2${3:+, $3})"; failed=1; fi
}

stage 0 "install the carried wheels ($WHEELS -> $SITE), offline"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run bash benchmarks/gpu_wheels.sh first"; exit 1; }
timeout "$(T 30)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl
verdict 0 $?
export PYTHONPATH="$PWD:$SITE"

stage 1 "environment"
SMOKE=$SMOKE timeout "$(T 30)" "$PY" - <<'PYEOF' | tee "$OUT/env.txt"
import importlib.metadata as md, os, platform, sys
from moe import runtime
runtime.set_xla_flags()
import jax
runtime.set_gpu_precision()
from moe.dispatch import AUTO_DISPATCH, DISPATCHERS, select_block_size, select_dispatch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
print(f"python {platform.python_version()} ({sys.executable})")
print("packages: " + ", ".join(f"{n} {version(n)}" for n in (
    "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax", "orbax-checkpoint", "numpy",
    "ml_collections", "tokamax", "pydantic", "qwix", "xprof", "pytest", "hypothesis", "grain", "tensorboardX")))
device = jax.devices()[0]
print(f"backend {jax.default_backend()}, {jax.device_count()} device(s): {device.device_kind}, "
      f"compute capability {getattr(device, 'compute_capability', '-')}")
print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
print(f"XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')}, "
      f"matmul precision {jax.config.jax_default_matmul_precision}")
print(f"dispatchers: {', '.join(DISPATCHERS)}; auto here: {select_dispatch('auto')}/b{select_block_size(0)} "
      f"(AUTO_DISPATCH {AUTO_DISPATCH})")
if os.environ["SMOKE"] != "1" and jax.default_backend() != "gpu":
    sys.exit(f"no GPU backend ({jax.devices()}): is the CUDA plugin installed?")
PYEOF
verdict 1 "${PIPESTATUS[0]}"

stage 2 "dispatch parity tests at highest precision"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout "$(T 150)" "$PY" -m pytest -q -x -p no:cacheprovider -n 0 \
  tests/test_dispatch.py 2>&1 | tee "$OUT/tests.txt"
verdict 2 "${PIPESTATUS[0]}"

stage 3 "bfloat16 parity of every dispatcher against dense (smoke size, one step each)"
timeout "$(T 90)" "$PY" benchmarks/dispatch_bench.py --size=smoke --dtype=bfloat16 --rounds=0 --block_sizes=128 \
  --max_gib=100 --out="$OUT/parity_bf16.json"
verdict 3 $?

if [ "$SMOKE" = 1 ]; then
  SHAPE=(--size=smoke --dtype=bfloat16 --remat=full --steps=2 --rounds=1 --block_sizes=128)
else
  SHAPE=(--size=137m --batch=8 --dtype=bfloat16 --remat=full --steps=5 --rounds=2 --block_sizes=128)
fi
# The likeliest GPU choices first: a timeout still leaves them in bench.json.
SHAPE+=(--dispatchers=dense,sparse_batched,tokamax,sparse,ragged,capacity)
stage 4 "dispatch_bench ${SHAPE[*]}"
# --max_gib: run every entry (an H200 has room); --budget_gib: the 8 GiB question.
timeout "$(T 180)" "$PY" benchmarks/dispatch_bench.py "${SHAPE[@]}" --max_gib=100 --budget_gib=8 --save \
  --out="$OUT/bench.json"
code=$?
verdict 4 $code "$([ $code = 124 ] && echo 'timed out: bench.json holds the entries that finished')"
cp benchmarks/results/dispatch_*.json "$OUT/" 2>/dev/null
ls "$OUT"
echo "== gpu_check $([ $failed = 0 ] && echo passed || echo FAILED) ($(date -u +%T))"
exit $failed
