"""The package README's example runs as written."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rr_fakes.pins import TESTED_VLLM
from rr_vllm._supported import SUPPORTED

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "5 [True, True, True, True, False]" in out
    assert "96000000 {'max_tokens': 2048, 'routed_experts_prompt_start': 0}" in out
    assert "[4] [True, True, True, False]" in out
    assert "1.44 12\ntorch.int16 [0, 5, 9]\n[[2, 3], [2, 3], [2, 3], [0, 0]]" in out
    assert "[False, False, True, True, False] uint8" in out
    assert "SGLang 0.5.23 with speculative_algorithm NGRAM returns all-zero generated rows" in out
    assert "merged [True, True, True, True, False]" in out


def test_readme_layout_lists_every_module_once() -> None:
    """The Layout tree names each module of the package (one line each, under its
    subpackage), and no module that does not exist."""
    tree = README.read_text().split("## Layout")[1].split("```text\n")[1].split("```")[0]
    listed, package = set(), ""
    for line in tree.splitlines()[1:]:
        name = line.strip().split()[0].rstrip(",")
        if line.startswith("    "):
            listed.add(f"{package}{name}")
        elif name.endswith("/"):
            package = name
        else:
            package = ""
            listed.update(n.strip() for n in line.split("  ")[1].split(",") if n.strip())
    src = ROOT / "src" / "rr_vllm"
    on_disk = {
        str(f.relative_to(src))
        for f in [*src.glob("*.py"), *src.glob("*.pyi"), *src.glob("*/*.py")]
        if not (f.parent != src and f.name == "__init__.py")
    }
    assert listed == on_disk


def test_readme_extra_and_doctor_state_the_version_data() -> None:
    text = " ".join(README.read_text().split())
    spec = SUPPORTED["vllm"]
    assert f"`vllm{spec}`" in text
    assert f"(`TESTED_VLLM`, {TESTED_VLLM})" in text
    low, tested_line = spec.split(",")[0].removeprefix(">="), TESTED_VLLM.rsplit(".", 1)[0]
    assert f"vLLM ({low} → {tested_line})" in text
    assert f"the real vLLM {tested_line} classes" in text
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["vllm"] == [f"vllm{spec}"]
    (entry,) = [e for e in entry_points(group="rr.supported") if e.name == "rr-vllm"]
    assert entry.load() == SUPPORTED
