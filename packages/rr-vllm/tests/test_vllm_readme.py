"""The package README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "5 [True, True, True, True, False]" in out
    assert "96000000 {'max_tokens': 2048, 'routed_experts_prompt_start': 0}" in out
    assert "[4] [True, True, True, False]" in out
    assert "1.44 12\ntorch.int16 [0, 5, 9]\n[[2, 3], [2, 3], [2, 3], [0, 0]]" in out
