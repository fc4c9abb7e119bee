"""The body of ``scripts/device_check`` (see that file and docs/tpu.md): the package's device
check (``remat_common.internal.device_check``, ``common/_tooling/checks/``) with this
repository's examples importable. Run it with a Python whose ``remat_common`` is this checkout's
(``$PY scripts/_device_check.py ...`` with the packed environment on a TPU host)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the examples it measures

if __name__ == "__main__":
    from remat_common.internal import device_check

    sys.exit(device_check(sys.argv[1:]))
