"""``python -m remat_common``: the ``remat`` command line (lint, doctor, report)."""

import sys

from ._tooling.cli._main import main

sys.exit(main())
