"""The leak check is a pytest plugin: tests in a folder without a conftest (rr-vllm's, a user's)
get it wherever rr-fakes is installed, and a test that leaves routers attached fails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

LEAKING_TESTS = """
from torch import nn

from rr_core import ReplayController


class Router(nn.Module):
    layer_number = 1


KEPT = []


def test_leaves_a_router_attached():
    controller = ReplayController(num_experts=4, top_k=2)
    controller.attach(nn.ModuleList([Router()]))
    KEPT.append(controller)  # attached past the test's end


def test_detaches():
    controller = ReplayController(num_experts=4, top_k=2)
    controller.attach(nn.ModuleList([Router()]))
    controller.detach()
"""


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_leaking.py").write_text(LEAKING_TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_folder_without_conftest_gets_the_leak_check(tmp_path: Path) -> None:
    assert not (tmp_path / "conftest.py").exists()
    run = _pytest(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed, 1 error" in run.stdout, run.stdout  # the leak fails at teardown
    assert "test left 1 routers attached; call controller.detach()" in run.stdout
    assert "ERROR at teardown of test_leaves_a_router_attached" in run.stdout


def test_the_plugin_can_be_turned_off_by_name(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "-p", "no:rr-leak-check")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_the_plugin_is_the_one_source_of_the_leak_check(request: pytest.FixtureRequest) -> None:
    """Every package's tests get the check from the plugin alone: no conftest or test module
    imports the fixture (which registered it a second time), and it applies here."""
    assert "_no_leaked_attachments" in request.fixturenames
    repo = Path(__file__).parents[3]
    sources = [*repo.glob("packages/*/tests/**/*.py"), *repo.glob("tests/**/*.py")]
    imports = re.compile(r"^from rr_fakes\.pytest_support import .*_no_leaked_attachments", re.M)
    importing = [str(p.relative_to(repo)) for p in sources if imports.search(p.read_text())]
    assert sources
    assert not importing, f"import the leak check from the plugin only: {importing}"
