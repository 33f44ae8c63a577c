"""The README's Megatron example runs as written on every line."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_megatron_readme_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    blocks = [b for b in blocks if "rr_fakes.megatron" in b]
    assert blocks, "the README has no Megatron example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
