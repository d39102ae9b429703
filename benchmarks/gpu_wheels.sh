#!/usr/bin/env bash
# Builds the wheel folder that benchmarks/gpu_check.sh installs from on the offline GPU machine
# (run it here, where PyPI is reachable; the folder is git-ignored and travels with the tree).
#
#   bash benchmarks/gpu_wheels.sh [DIR]      # DIR defaults to .whl in the repo root
#
# The GPU machine's own python3 (3.12) already holds jax/jaxlib 0.11.2 with the CUDA 13 plugin,
# flax, optax, orbax-checkpoint, chex, absl-py, numpy, pandas, scipy, matplotlib, rich,
# tensorboard, tabulate, pytest, pytest-xdist, hypothesis, filelock, jaxtyping, tqdm (and their
# needs). It lacks what is carried here, at the lock's versions:
#   * filelock: its own may predate 3.30's lock_descriptor, which moe.lockfile takes (pure Python, 220 KB);
#   * ml_collections: every config is a ConfigDict;
#   * tensorboardX: training's event files (cheap; the check itself does not train);
#   * the gpu extra: tokamax and the part of its closure the machine lacks, with the xprof
#     import stub (scripts/xprof_stub.py) instead of xprof's 32 MB and ~40 packages.
# Not carried: grain (imported only when training reads data; the check never does) and the
# CUDA jax (already there). Prints the folder's size; it must stay under the 64 MiB that travel.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
# The project's Python: its .venv, else the one scripts/pick_python.sh finds (never a failing pyenv shim).
source scripts/pick_python.sh
PY=$( [ -x .venv/bin/python ] && echo .venv/bin/python || pick_python ) || {
  echo "gpu_wheels: Python >= 3.12 is required; set PYTHON=/path/to/python3.12" >&2; exit 2; }

pin() {  # the exact pin of package $1 in the lock files
  local line
  line=$(grep -ih "^$1==" requirements.lock requirements-gpu.lock | head -1)
  [ -n "$line" ] || { echo "gpu_wheels: $1 is not pinned in requirements*.lock" >&2; exit 1; }
  echo "$line"
}
# Already on the GPU machine, so not carried: jaxtyping, tqdm, wadler_lindig (tokamax's needs).
CARRIED="filelock ml_collections tensorboardX tokamax einshape immutabledict pydantic pydantic_core annotated-types
typing-inspection qwix"
specs=()
for name in $CARRIED; do specs+=("$(pin "$name")"); done

rm -rf "$DEST" && mkdir -p "$DEST"
# cp312 wheels for x86-64 Linux: pydantic-core is manylinux_2_17, others 2_27/2_28.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${specs[@]}"
"$PY" scripts/xprof_stub.py "$DEST" >/dev/null
ls -1 "$DEST"
bytes=$(du -sb "$DEST" | cut -f1)
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, $((bytes / 1024)) KiB in $DEST (limit of the travelling tree: 64 MiB)"
[ "$bytes" -lt $((64 * 1024 * 1024)) ] || { echo "gpu_wheels: $DEST is over 64 MiB" >&2; exit 1; }
