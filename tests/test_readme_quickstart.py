"""The README's two commands are what CI runs: `.ci/run` installs what the README's test command
installs and runs the same nox command (so a green CI proves the README's command)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parents[1]


def quick_start() -> list[list[str]]:
    """The commands of the README's Quick start block, each split into shell words."""
    text = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, "the Quick start has a bash block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines()]


def test_the_readme_test_command_is_the_ci_command() -> None:
    demo, tests = quick_start()
    assert demo[-2:] == ["-s", "demo"]
    install, run = " ".join(tests).split(" && ")
    script = [
        shlex.split(line, comments=True) for line in (ROOT / ".ci" / "run").read_text().splitlines()
    ]
    ci = [words for words in script if "pip" in words]
    quiet = [[word for word in words if word != "--quiet"] for words in ci]
    assert quiet == [shlex.split(install)]
    ci_run = [words for words in script if words][-1]
    assert ci_run[-3:] == run.split(), "CI runs the README's nox command, with no session filter"
    assert "nox[uv]" in install  # the fast installer comes with nox
