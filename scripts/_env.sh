# Sourced by the scripts in this folder: finds a Python >= 3.12 and prepares .venv from the lock file.
# Honours $REMAT_PYTHON (an interpreter to use) and $REMAT_VENV (where to build the environment).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${REMAT_VENV:-$ROOT/.venv}

_py_ok() {  # usage: _py_ok PYTHON -> true when it runs and is >= 3.12
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local c
  if [ -n "${REMAT_PYTHON:-}" ]; then
    _py_ok "$REMAT_PYTHON" && { echo "$REMAT_PYTHON"; return 0; }
    echo "error: REMAT_PYTHON=$REMAT_PYTHON is not a Python >= 3.12" >&2; return 1
  fi
  for c in python3.13 python3.12 python3 python; do
    if command -v "$c" >/dev/null 2>&1 && _py_ok "$(command -v "$c")"; then command -v "$c"; return 0; fi
  done
  # pyenv keeps interpreters that are not on PATH; newest first.
  local root
  root=$( (pyenv root 2>/dev/null) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for c in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
    if [ -x "$c/bin/python" ] && _py_ok "$c/bin/python"; then echo "$c/bin/python"; return 0; fi
  done
  cat >&2 <<'MSG'
error: no Python >= 3.12 found (JAX 0.11 requires it).
  Install one, then re-run this command. For example:
    Debian/Ubuntu:  apt-get install python3.12 python3.12-venv
    pyenv:          pyenv install 3.12
    uv:             uv python install 3.12
  or point REMAT_PYTHON at an interpreter: REMAT_PYTHON=/path/to/python3.12 ./scripts/test
MSG
  return 1
}

ensure_venv() {  # builds $VENV with the locked dependencies; re-installs only when inputs change
  local py stamp want
  if [ ! -x "$VENV/bin/python" ]; then
    py=$(find_python)
    echo "setting up $VENV with $py ($("$py" -V 2>&1))" >&2
    "$py" -m venv "$VENV"
  fi
  stamp="$VENV/.remat-installed"
  want=$(cat "$ROOT/pyproject.toml" "$ROOT/requirements/lock.txt" | cksum)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
      -c "$ROOT/requirements/lock.txt" -e "$ROOT[all]" >&2
    echo "$want" >"$stamp"
  fi
}
