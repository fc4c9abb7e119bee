"""The README's ten-line example runs as written and keeps ``h`` on host."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_ten_line_example_runs_and_offloads_h():
    text = README.read_text()
    section = text.split("## Ten lines", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    rows = [line for line in out.getvalue().splitlines()[1:] if not line.startswith("argument")]
    assert len(rows) == 1  # h, the [2, 4] activation, and nothing else is kept...
    assert rows[0].startswith("offloaded") and "[2, 4]" in rows[0] and rows[0].endswith("host")
