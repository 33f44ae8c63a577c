"""The README's compatibility table says what the noxfile tests: every release it names is a
pinned release of the session it names, and every session it names exists by default."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ROOT / "packages"


def data(package: str, module: str, name: str = "_supported.py") -> dict[str, object]:
    return runpy.run_path(str(PACKAGES / package / "src" / module / name))


def pins() -> dict[str, object]:
    """Every test pin (megatron-core lines, verl, bridge, vLLM, SGLang, transformers, TRL)."""
    return data("rr-fakes", "rr_fakes", "pins.py")


def rows() -> dict[str, str]:
    """Each compatibility row's first cell -> the whole row."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return {line.split("|")[1].strip(): line for line in lines[1:]}


def row(starts: str) -> str:
    (found,) = [line for first, line in rows().items() if first.startswith(starts)]
    return found


def releases(cell: str) -> list[str]:
    return re.findall(r"\b\d+\.\d+\.\d+\b", cell.split("|")[1])


def test_megatron_rows_name_the_pinned_releases() -> None:
    lines = pins()["MEGATRON_LINES"]
    pinned = [release for release, _, _ in lines.values()]  # type: ignore[attr-defined]
    assert releases(row("megatron-core 0.12.3, 0.13.1")) == pinned
    npu_lines = pins()["NPU_MEGATRON_LINES"]
    assert releases(row("Ascend")) == [lines[line][0] for line in npu_lines]  # type: ignore[index]
    two = [pinned[0], pinned[-1]]  # the distributed lines: oldest and newest
    assert releases(row("megatron-core 0.12.3 and")) == two


def test_engine_model_and_bridge_rows_name_the_pinned_releases() -> None:
    transformers = pins()["TRANSFORMERS_LINES"]
    assert releases(row("transformers")) == list(transformers.values())  # type: ignore[attr-defined]
    mcore = pins()
    bridge = row("Megatron-Bridge")
    line = mcore["MEGATRON_LINES"][mcore["BRIDGE_MEGATRON_LINE"]][0]  # type: ignore[index]
    assert releases(bridge) == [mcore["BRIDGE_RELEASE"], line]
    vllm = pins()
    engines = row("vLLM 0.14")
    assert vllm["TESTED_VLLM"] in engines  # type: ignore[operator]
    assert releases(row("vLLM 0.30.0")) == [vllm["TESTED_VLLM_CPU"]]  # the real engine
    sglang = vllm["TESTED_SGLANG"]
    assert f"SGLang {sglang[0]} → {sglang[-1]}" in engines  # type: ignore[index]


def test_every_session_the_table_names_runs_by_default() -> None:
    source = (ROOT / "noxfile.py").read_text()
    defaults = re.search(r"nox\.options\.sessions = \[(.*?)\]", source, re.S)
    assert defaults is not None
    sessions = set(re.findall(r'"(\w+)"', defaults.group(1)))
    named = {name for line in rows().values() for name in re.findall(r"nox -s (\w+)", line)}
    assert named
    assert named <= sessions, named - sessions
