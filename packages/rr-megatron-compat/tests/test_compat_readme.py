"""The package README's example runs as written against the installed megatron-core."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_replays_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    assert "{1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}" in capsys.readouterr().out
