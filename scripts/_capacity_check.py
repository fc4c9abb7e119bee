"""The body of ``scripts/capacity_check`` (see that file and docs/tpu.md): the package's capacity
check (``remat_common.internal.capacity_check``, ``common/_tooling/checks/``) with this
repository's examples importable. Run it with a Python whose ``remat_common`` is this checkout's
(``$PY scripts/_capacity_check.py ...`` with the packed environment on a TPU host)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the examples it trains

if __name__ == "__main__":
    from remat_common.internal import capacity_check

    sys.exit(capacity_check(sys.argv[1:]))
