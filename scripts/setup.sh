#!/usr/bin/env bash
# Idempotent fresh-machine set-up: creates/reuses .venv in the repo root, installs the
# pinned dependency closure (requirements.lock) plus this project (editable), and fetches
# the GPT-2 BPE rank file offline-safely (from the openai-whisper sdist on PyPI).
# Re-running is fast: installation is skipped while requirements.lock and pyproject.toml
# are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: Python >= 3.11 is required (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv

stamp=.venv/.installed-$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing pinned dependencies into .venv ..."
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.lock
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# GPT-2 BPE ranks for tiktoken, verified by SHA-256 (no-op when already cached).
.venv/bin/python -m moe.data.fetch_tokenizer
