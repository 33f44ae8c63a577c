"""The README's Megatron examples run as written on every line (the Hugging Face one where
transformers, which writes its checkpoint, is installed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def run(block: str) -> None:
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_megatron_readme_example_runs() -> None:
    blocks = [b for b in BLOCKS if "rr_fakes.shims.megatron" in b]
    assert blocks, "the README has no Megatron example"
    for block in blocks:
        run(block)


def test_hf_to_megatron_readme_example_runs() -> None:
    blocks = [b for b in BLOCKS if "rr_fakes.hf_to_megatron" in b]
    assert blocks, "the README has no rr_fakes.hf_to_megatron example"
    pytest.importorskip(
        "transformers", reason="the example's checkpoint is written by transformers"
    )
    for block in blocks:
        run(block)
