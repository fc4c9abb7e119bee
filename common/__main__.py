"""``python -m remat_common``: the ``remat`` command line (lint, doctor, report)."""

import sys

from ._tooling._cli import main

sys.exit(main())
