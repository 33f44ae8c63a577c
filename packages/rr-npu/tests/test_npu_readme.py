"""The README example runs as written.

Real-world failure guarded against: a documented setup (rr install before Megatron, MindSpeed's
adaptor, an engine's ``repatch()``) that no longer leaves replay on.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from rr_npu_testing import mindspeed_unavailable

REASON = mindspeed_unavailable()
README = Path(__file__).parents[1] / "README.md"


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_readme_example_runs(tmp_path: Path) -> None:
    """In a fresh interpreter: the example installs rr before Megatron is imported, and this
    test process imported it long ago."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.strip().endswith("{1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}")


def test_readme_states_the_version_data() -> None:
    from rr_fakes.pins import MEGATRON_LINES
    from rr_fakes.pins import NPU_MEGATRON_LINES as NPU_LINES
    from rr_npu._supported import SUPPORTED

    text = " ".join(README.read_text().split())
    assert f"`torch-npu{SUPPORTED['torch-npu']}`" in text
    assert f"test ({_listed(NPU_LINES)})" in text
    releases = _listed([MEGATRON_LINES[line][0] for line in NPU_LINES])
    assert f"real megatron-core {releases}, the releases rr-megatron-compat pins" in text


def _listed(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]
