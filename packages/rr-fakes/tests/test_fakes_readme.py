"""The README's torch-only example runs as written (the Megatron one runs in the harness)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


#: The modules whose examples need megatron-core (the harness's README test runs those).
MEGATRON_MODULES = re.compile(r"rr_fakes\.(shims\.megatron|hf_to_megatron)\b")


def readme_blocks(megatron: bool) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [b for b in blocks if bool(MEGATRON_MODULES.search(b)) == megatron]


def test_torch_only_readme_example_runs() -> None:
    blocks = readme_blocks(megatron=False)
    assert blocks, "the README has no torch-only example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
