#!/usr/bin/env bash
# Idempotent fresh-machine set-up: creates/reuses .venv in the repo root, installs the pinned
# runtime and test closures (requirements.lock, requirements-test.lock) plus this project
# (editable), and fetches the GPT-2 BPE rank file offline-safely (from the openai-whisper sdist
# on PyPI). Re-running is fast: installation is skipped while the locks and pyproject.toml are
# unchanged.
#
#   bash scripts/setup.sh           # CPU (the default)
#   bash scripts/setup.sh --cuda    # also the CUDA 13 build of the pinned jax and the gpu extra (tokamax)
#
# (CUDA=1 bash scripts/setup.sh does the same as --cuda.)
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA=${CUDA:-0}
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $arg (use --cuda or nothing)" >&2; exit 2 ;;
  esac
done

# Python >= 3.12 (jax 0.11's floor), found the one way (scripts/pick_python.sh).
source scripts/pick_python.sh
if ! PY=$(pick_python); then
  echo "setup: Python >= 3.12 is required (found: $(python3 --version 2>&1)); set PYTHON=/path/to/python3.12" >&2
  exit 1
fi
# A .venv of an older Python (made before the move to jax 0.11) is made anew.
if [ -e .venv ] && ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  echo "setup: .venv's Python is older than 3.12: making it anew with $PY"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv

locks="requirements.lock requirements-test.lock"
[ "$CUDA" = 1 ] && locks="$locks requirements-gpu.lock"
stamp=.venv/.installed-$(cat $locks pyproject.toml | sha256sum | cut -c1-16)-cuda$CUDA
if [ ! -f "$stamp" ]; then
  echo "setup: installing pinned dependencies into .venv ..."
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.lock -r requirements-test.lock
  if [ "$CUDA" = 1 ]; then
    # The CUDA 13 build of exactly the pinned jax (its plugin and CUDA wheels), then the gpu
    # extra's closure as locked (--no-deps: tokamax's xprof is replaced by an import stub).
    jax_pin=$(sed -n 's/^jax==\(.*\)$/\1/p' requirements.lock)
    .venv/bin/python -m pip install -q "jax[cuda13]==${jax_pin}" "jaxlib==${jax_pin}"
    .venv/bin/python -m pip install -q --no-deps -r requirements-gpu.lock
    stub_dir=$(mktemp -d)
    .venv/bin/python scripts/xprof_stub.py "$stub_dir" >/dev/null
    .venv/bin/python -m pip install -q --no-deps "$stub_dir"/xprof-*.whl
    rm -rf "$stub_dir"
  fi
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# GPT-2 BPE ranks for tiktoken, verified by SHA-256 (no-op when already cached).
.venv/bin/python -m moe.data.fetch_tokenizer
