"""The canary's table (noxsupport.newest): what counts as a pass, and the failure it names."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from noxsupport.newest import Outcome, first_failure, outcome, table


def test_a_run_with_a_failure_names_the_first_one():
    summary = "1 failed, 3 passed, 1 error in 2s"
    output = f"..F.E\nFAILED a.py::test_x - boom\nERROR b.py::test_y\n{summary}"
    found = outcome("vllm", "0.34.0", output)
    assert not found.passed
    assert found.first_failure == "FAILED a.py::test_x - boom"


def test_only_passes_pass_and_no_tests_is_a_failure():
    assert outcome("trl", "1.17.0", "....\n4 passed in 1.0s").passed
    assert not outcome("trl", "1.17.0", "\nno tests ran in 0.1s").passed
    assert first_failure("ImportError: no module\n") == "ImportError: no module"


def test_the_table_has_one_line_per_dependency():
    rows = [Outcome("transformers", "5.25.0", True), Outcome("vllm", "0.34.0", False, "FAILED x")]
    lines = table(rows).splitlines()
    assert len(lines) == 3
    assert lines[1].split()[:3] == ["transformers", "5.25.0", "pass"]
    assert lines[2].split()[:4] == ["vllm", "0.34.0", "FAIL", "FAILED"]
