"""The package README's example runs as written against the installed megatron-core, and its
version statements are the package's version data."""

from __future__ import annotations

import ast
import dataclasses
import re
import runpy
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import rr_megatron_compat as rmc

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
SUPPORTED_FILE = ROOT / "src" / "rr_megatron_compat" / "_supported.py"
PINS_FILE = ROOT.parent / "rr-fakes" / "src" / "rr_fakes" / "pins.py"  # the tests' releases


def test_readme_example_replays_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    assert "{1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}" in capsys.readouterr().out


def _supported_data() -> dict[str, Any]:
    return runpy.run_path(str(SUPPORTED_FILE))


def test_version_data_is_import_free_and_is_what_the_package_reads() -> None:
    tree = ast.parse(SUPPORTED_FILE.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    data = _supported_data()  # as the noxfile loads it, by path
    assert data["SUPPORTED"] == rmc.SUPPORTED
    (entry,) = [e for e in entry_points(group="rr.supported") if e.name == "rr-megatron-compat"]
    assert entry.load() == data["SUPPORTED"]  # rr doctor's table
    flags = {f.name for f in dataclasses.fields(rmc.MegatronLine)} - {"version"}
    assert flags == set(data["MEGATRON_FEATURES"])


def test_readme_and_extra_state_the_data() -> None:
    data, text = {**_supported_data(), **runpy.run_path(str(PINS_FILE))}, README.read_text()
    spec = data["SUPPORTED"]["megatron-core"]
    assert f"`megatron-core{spec}`" in text
    lines = list(data["MEGATRON_LINES"])
    assert f"megatron-core {lines[0]} to {lines[-1]}" in " ".join(text.split())
    assert ", ".join(release for release, _, _ in data["MEGATRON_LINES"].values()) in " ".join(
        text.split()
    )
    assert f"verl {data['VERL_RELEASE']} installation" in text
    assert f"tested on megatron-core {data['VERL_MEGATRON_LINE']})" in text
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert extras["megatron"] == [f"megatron-core{spec}"]
    assert set(data["KNOWN_ISSUES"]) == set(lines)
