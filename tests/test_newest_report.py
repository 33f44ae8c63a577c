"""The canary's table (noxsupport.newest): what counts as a pass, and the failure it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from noxsupport.newest import NOT_INSTALLED, READ_RELEASE, Outcome, first_failure, outcome, table


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


def test_the_summary_is_pytests_closing_line_not_the_last_line():
    late = "WARNING:2026-12-05 18:25:35,342:Platform 'nvidia' (PlatformCUDA) is registered"
    assert outcome(
        "verl", "0.9.1", f"....\n===== 4 passed, 2 skipped in 61.02s =====\n{late}"
    ).passed
    failed = outcome("verl", "0.9.1", f"..F\nFAILED a.py::t - x\n1 failed, 2 passed in 3s\n{late}")
    assert not failed.passed
    assert failed.first_failure == "FAILED a.py::t - x"
    assert not outcome("verl", "0.9.1", f"Traceback\n{late}").passed  # no summary: a crash


def test_the_line_carries_pytests_counts_so_a_skipped_suite_shows():
    found = outcome("trl", "1.16.0", "..s\n===== 2 passed, 40 skipped in 61.02s (0:01:01) =====")
    assert found.passed
    assert found.summary == "2 passed, 40 skipped"
    assert "2 passed, 40 skipped" in table([found]).splitlines()[1]
    assert outcome("trl", "1.16.0", "Traceback").summary == ""


def test_a_dependency_the_venv_lacks_fails_its_line_by_name():
    read = [sys.executable, "-c", READ_RELEASE]
    assert subprocess.run([*read, "pytest"], capture_output=True, text=True).stdout.strip()
    lacking = subprocess.run([*read, "no-such-dist-rr"], capture_output=True, text=True)
    assert lacking.stdout.strip() == NOT_INSTALLED
    found = outcome("trl", NOT_INSTALLED, "sss\n3 skipped in 0.1s")
    assert not found.passed
    assert found.first_failure == "trl is not installed (nox -R skips installs; rerun with -r)"
