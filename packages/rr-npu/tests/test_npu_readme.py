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


def test_readme_states_the_version_data() -> None:
    from rr_megatron_compat._supported import MEGATRON_LINES
    from rr_npu._supported import MEGATRON_LINES as NPU_LINES
    from rr_npu._supported import SUPPORTED

    text = " ".join(README.read_text().split())
    assert f"`torch-npu{SUPPORTED['torch-npu']}`" in text
    assert f"test ({' and '.join(NPU_LINES)})" in text
    releases = " and ".join(MEGATRON_LINES[line][0] for line in NPU_LINES)
    assert f"real megatron-core {releases}, the releases rr-megatron-compat pins" in text
