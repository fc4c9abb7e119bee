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
  for c in python3.12 python3.13 python3 python; do
    if command -v "$c" >/dev/null 2>&1 && _py_ok "$(command -v "$c")"; then command -v "$c"; return 0; fi
  done
  # pyenv keeps interpreters that are not on PATH; newest first.
  local root
  root=$( (pyenv root 2>/dev/null) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for c in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -V); do
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

#: The installer: uv (pinned; fetched once into .venv-tools with the new environment's pip) installs
#: the same locked versions as pip in seconds instead of minutes from an empty cache. Without it
#: (REMAT_INSTALLER=pip, or uv cannot be fetched) pip installs them.
UV_VERSION=0.13.9
TOOLS=$ROOT/.venv-tools

_uv() {  # usage: _uv VENV -> prints the path of a uv executable, or fails
  local venv=$1
  [ "${REMAT_INSTALLER:-uv}" = uv ] || return 1
  if [ ! -x "$TOOLS/bin/uv" ] || [ "$("$TOOLS/bin/uv" --version 2>/dev/null)" != "uv $UV_VERSION" ]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check --upgrade --target "$TOOLS" \
      "uv==$UV_VERSION" >>"$venv/install.log" 2>&1 || return 1
  fi
  [ -x "$TOOLS/bin/uv" ] && echo "$TOOLS/bin/uv"
}

_pip() {  # usage: _pip VENV ARGS... ; pip-install ARGS into VENV (with uv when it can), quiet unless it fails
  local venv=$1 uv
  shift
  if uv=$(_uv "$venv"); then
    if "$uv" pip install --python "$venv/bin/python" "$@" >>"$venv/install.log" 2>&1; then
      return 0
    fi
    echo "uv pip install failed; trying pip (log: $venv/install.log)" >&2
  fi
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >>"$venv/install.log" 2>&1; then
    tail -n 30 "$venv/install.log" >&2
    echo "error: pip install failed (full log: $venv/install.log)" >&2
    return 1
  fi
}

#: Changes when the way an environment is installed changes, so that existing ones are redone.
_INSTALL_RECIPE="locked; bytecode compiled"

_ensure_env() {  # usage: _ensure_env VENV STAMP_INPUTS... -- PIP_ARGS... ; builds VENV once per input change
  local venv=$1 py stamp want inputs=()
  shift
  while [ "$1" != "--" ]; do inputs+=("$1"); shift; done
  shift
  if [ ! -x "$venv/bin/python" ]; then
    py=$(find_python)
    echo "setting up $venv with $py ($("$py" -V 2>&1))" >&2
    "$py" -m venv "$venv"
  fi
  stamp="$venv/.remat-installed"
  want=$( { cat "${inputs[@]}"; echo "$_INSTALL_RECIPE"; } | cksum)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing the locked dependencies into $venv (log: $venv/install.log)" >&2
    _pip "$venv" "$@"
    # Bytecode for everything installed (pip compiles what it installs, uv does not): where
    # PYTHONDONTWRITEBYTECODE is set, as on many CI machines, nothing is compiled on import, and
    # every process that imports jax and flax would compile their sources again (about 5 s).
    "$venv/bin/python" -m compileall -q -j 0 "$("$venv/bin/python" -c \
      'import sysconfig; print(sysconfig.get_path("purelib"))')" >>"$venv/install.log" 2>&1 || true
    echo "$want" >"$stamp"
  fi
}

ensure_venv() {  # .venv: jax 0.11.2 and everything else from requirements/lock.txt
  _ensure_env "$VENV" "$ROOT/pyproject.toml" "$ROOT/requirements/lock.txt" -- \
    -c "$ROOT/requirements/lock.txt" -e "$ROOT[all,dev]"
}

JAX0110_VENV=${REMAT_JAX0110_VENV:-$ROOT/.venv-jax0110}

ensure_jax0110_venv() {  # the floor: jax 0.11.0 with the newest flax/equinox/optax/orbax that install with it
  _ensure_env "$JAX0110_VENV" "$ROOT/pyproject.toml" "$ROOT/requirements/lock-jax0110.txt" -- \
    -c "$ROOT/requirements/lock-jax0110.txt" -e "$ROOT[all,dev]"
}

JAX012_VENV=${REMAT_JAX012_VENV:-$ROOT/.venv-jax012}

ensure_jax012_venv() {  # jax 0.12: what a user's `pip install jax-remat-plan[...]` resolves today
  _ensure_env "$JAX012_VENV" "$ROOT/pyproject.toml" "$ROOT/requirements/lock-jax012.txt" -- \
    -c "$ROOT/requirements/lock-jax012.txt" -e "$ROOT[all,dev]"
}

TARGET_VENV=${REMAT_TARGET_VENV:-$ROOT/.venv-target}

ensure_target_venv() {  # .venv-target: .venv's packages plus the GPU and TPU compilers (~6.4 GB)
  _ensure_env "$TARGET_VENV" "$ROOT/pyproject.toml" "$ROOT/requirements/lock-target.txt" -- \
    -c "$ROOT/requirements/lock-target.txt" -e "$ROOT[all,dev,target-gpu,target-tpu]"
}
