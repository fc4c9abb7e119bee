"""The one build step ``pyproject.toml`` cannot declare: files kept outside the packages, shipped
as their package data.

The documentation (``docs/``: ``remat docs NAME`` prints a page) and the example GPTs' report
configs with their targets and plans (``examples/*/``: ``remat report example:nnx_gpt``) live at
the top of the repository, where the README links them; the wheel carries copies under
``remat_common/docs/`` and ``remat_common/examples/``. An editable install copies nothing:
``remat_common._shipped`` reads the repository's own folders there.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent

#: (folder of the repository, glob patterns in it): copied to ``remat_common/<folder>/``.
SHIPPED = (
    ("docs", ("*.md", "figures/*.png")),
    ("examples", ("nnx_gpt/report.yaml", "nnx_gpt/model.py", "nnx_gpt/plans/*.yaml",
                  "eqx_gpt/report.yaml", "eqx_gpt/model.py", "eqx_gpt/plans/*.yaml")),
)


class BuildPy(build_py):
    """``build_py``, then the :data:`SHIPPED` files into the package (not in editable mode)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder, patterns in SHIPPED:
            for pattern in patterns:
                files = sorted((ROOT / folder).glob(pattern))
                if not files:
                    raise FileNotFoundError(f"setup.py: nothing matches {folder}/{pattern}")
                for f in files:
                    dst = Path(self.build_lib, "remat_common", folder, f.relative_to(ROOT / folder))
                    self.mkpath(str(dst.parent))
                    self.copy_file(str(f), str(dst))


setup(cmdclass={"build_py": BuildPy})
