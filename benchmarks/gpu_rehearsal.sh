#!/usr/bin/env bash
# Rehearses benchmarks/gpu_check.sh on this CPU, as the GPU machine would run it: offline (a
# network namespace with no network: unshare -n, as root), on a Python that holds only the GPU
# machine's package list (a venv built once from PyPI, cached outside the repo), plus the carried
# wheels (.whl, from benchmarks/gpu_wheels.sh), in a copy of the tree as it travels (tracked and
# untracked-not-ignored files + .whl), at smoke size. Prints the check's stages, the wall time
# and the size of what travels.
#
#   bash benchmarks/gpu_rehearsal.sh          # results under $OUT (default: a new temp folder)
#
# Needs root (unshare -n); the first run needs PyPI (the venv and the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${REHEARSAL_VENV:-${CACHEABLE_MOE_CACHE:-$HOME/.cache/cacheable-moe}/gpu-rehearsal-venv}
# The GPU machine's preinstalled Python packages (issue 28's list; CUDA plugins aside), newest
# releases for jax 0.11.2 and numpy 2.5 on Python 3.12.
GPU_MACHINE_PACKAGES=(jax==0.11.2 jaxlib==0.11.2 "numpy>=2.5,<2.6" flax optax orbax-checkpoint chex absl-py
  pandas scipy matplotlib rich tensorboard tabulate pytest pytest-xdist hypothesis filelock jaxtyping tqdm)
if [ ! -f "$VENV/.complete" ]; then
  source scripts/pick_python.sh
  if ! PY312=$(pick_python); then
    echo "rehearsal: Python >= 3.12 is required to build $VENV; set PYTHON=/path/to/python3.12" >&2; exit 2
  fi
  echo "rehearsal: building $VENV (once) with $PY312"
  "$PY312" -m venv "$VENV"
  "$VENV/bin/python3" -m pip install -q "${GPU_MACHINE_PACKAGES[@]}"
  touch "$VENV/.complete"
fi
[ -d .whl ] || bash benchmarks/gpu_wheels.sh
if "$VENV/bin/python3" -c 'import grain' 2>/dev/null || "$VENV/bin/python3" -c 'import ml_collections' 2>/dev/null; then
  echo "rehearsal: $VENV holds packages the GPU machine lacks" >&2; exit 1
fi

TREE=$(mktemp -d)
OUT=${OUT:-$(mktemp -d)}
trap 'rm -rf "$TREE"' EXIT
{ git ls-files -co --exclude-standard; find .whl -type f; } | tar -cf - -T - | tar -xf - -C "$TREE"
echo "rehearsal: the travelling tree is $(du -sm "$TREE" | cut -f1) MiB ($(du -sk .whl | cut -f1) KiB of wheels); results in $OUT"
start=$(date +%s)
set +e
unshare -n env -u PYTHONPATH PATH="$VENV/bin:$PATH" OUT="$OUT" SITE="$TREE/.site" \
  CACHEABLE_MOE_CACHE="$TREE/.cache" bash "$TREE/benchmarks/gpu_check.sh" --smoke
code=$?
set -e
echo "rehearsal: exit $code after $(( $(date +%s) - start )) s wall; files under \$OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $code
