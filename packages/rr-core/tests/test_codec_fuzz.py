"""Codec fuzzing: mutated payloads through every decoder and kernel, in a child
process so that a compiled kernel reading or writing past a buffer shows as a crash, not as
corrupted memory in the test process. See codec_fuzz_worker.py for what is mutated and checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("codec_fuzz_worker.py")


@pytest.mark.parametrize("seed", [0])
def test_mutated_payloads_end_in_an_rr_error_or_routes_they_can_hold(seed: int) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), str(seed), "3"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"the child ended with {done.returncode}:\n{done.stderr[-3000:]}"
    assert done.stdout.startswith("ok "), done.stdout
    assert int(done.stdout.split()[1]) > 500
