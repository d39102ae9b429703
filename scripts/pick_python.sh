# Sourced (not run) by scripts/setup.sh, benchmarks/gpu_rehearsal.sh and benchmarks/gpu_wheels.sh: the one way to find a
# Python >= 3.12 (jax 0.11's floor).
#
# pick_python prints $PYTHON, else the first of these that runs and is new enough. Each candidate
# is run, not just found: with pyenv, `python3.12` on the PATH can be a shim that fails, and pyenv
# keeps versions that are not on the PATH.
pick_python() {
  local cand
  for cand in ${PYTHON:-} python3.12 python3.13 python3 "$(pyenv root 2>/dev/null)"/versions/3.1[23]*/bin/python3 \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3; do
    if [ -n "$cand" ] && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}
