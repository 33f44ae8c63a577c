"""The README's example runs as written, and its claims follow the version data."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import rr_transformers
from rr_transformers._supported import FAMILIES, SUPPORTED, TESTED_RELEASES

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == "qwen3_moe (1, 2)\nTrue\nTrue\n"
    assert not rr_transformers.is_installed()


def test_readme_states_the_version_data() -> None:
    text = " ".join(README.read_text().split())
    spec = SUPPORTED["transformers"]
    assert f"(`{spec}`, the `transformers` extra)" in text
    assert " and ".join(TESTED_RELEASES) in text
    for name, data in FAMILIES.items():
        row = next(line for line in README.read_text().splitlines() if f"`{name}`" in line)
        assert row.rstrip().endswith(f"| {data.get('since', '5.0')} |"), row
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["transformers"] == [f"transformers{spec}"]
    (entry,) = [e for e in entry_points(group="rr.supported") if e.name == "rr-transformers"]
    assert entry.load() == SUPPORTED


def test_importing_the_package_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, rr_transformers, rr_transformers._supported;"
        "rr_transformers.__version__;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_doctor_names_the_site_install_really_hooks(hooks: None) -> None:
    from rr_transformers._doctor import transformers_report
    from rr_transformers._versions import checked_version

    report = transformers_report()
    assert report["ok"] is True
    for name, family in rr_transformers.KNOWN_FAMILIES.items():
        if not family.available(checked_version()):
            assert report["families"][name] is None
            continue
        owner, attribute, _ = family.hook_site(checked_version())
        assert isinstance(vars(owner)[attribute], rr_transformers.RouterTopkProxy)
        assert report["families"][name] == f"{owner.__name__}.{attribute}"
