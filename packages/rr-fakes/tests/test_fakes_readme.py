"""The README's torch-only example runs as written (the Megatron one runs in the harness)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def readme_blocks(megatron: bool) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [b for b in blocks if ("rr_fakes.megatron" in b) == megatron]


def test_torch_only_readme_example_runs() -> None:
    blocks = readme_blocks(megatron=False)
    assert blocks, "the README has no torch-only example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
