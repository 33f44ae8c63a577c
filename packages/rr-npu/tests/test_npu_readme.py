"""The README example runs as written.

Real-world failure guarded against: a documented setup (MindSpeed adaptor, rr install, an
engine's ``repatch()``) that no longer leaves replay on.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from rr_fakes.megatron import unavailable_reason

REASON = unavailable_reason()
README = Path(__file__).parents[1] / "README.md"


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_readme_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    assert out.getvalue().strip().endswith("{1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}")
