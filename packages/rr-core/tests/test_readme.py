"""The package README's example runs as written."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    assert "{1: 1.0, 2: 1.0, 3: 1.0}" in capsys.readouterr().out


def _table_rows() -> list[tuple[list[str], list[str]]]:
    """(subpackages, names) of each row of the README's "What is in the box" table; method
    names in parentheses are left out."""
    box = README.read_text().split("## What is in the box")[1].split("\n## ")[0]
    rows = []
    for line in box.splitlines():
        if not line.startswith("| `rr_core."):
            continue
        where, names = line.split("|")[1:3]
        names = re.sub(r"\([^()]*\)", "", names)
        rows.append((re.findall(r"`(rr_core\.\w+)`", where), re.findall(r"`(\w+)`", names)))
    return rows


def _stub_modules() -> dict[str, str]:
    """Each public name of rr_core and the module ``__init__.pyi`` loads it from."""
    import rr_core

    tree = ast.parse(Path(rr_core.__file__).with_suffix(".pyi").read_text())
    return {
        alias.name: f"rr_core.{node.module}"
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_readme_names_live_in_the_subpackages_it_says() -> None:
    homes = _stub_modules()
    rows = _table_rows()
    assert len(rows) >= 7
    for packages, names in rows:
        for name in set(names) - {"raw", "packed", "set"}:  # codec names, not attributes
            if name in homes:  # a top-level name: its module is inside the row's subpackages
                assert any(f"{homes[name]}.".startswith(f"{p}.") for p in packages), name
            else:  # a name of the subpackage module itself
                assert any(hasattr(importlib.import_module(p), name) for p in packages), name
