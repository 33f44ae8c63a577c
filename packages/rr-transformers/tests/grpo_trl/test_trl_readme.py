"""The README's TRL section states what the code does: the one line, the TRL range, every
patch point install() makes and the metrics rr logs (its table is test_trl_grpo's runs)."""

from __future__ import annotations

import re
from pathlib import Path

import rr_transformers.trl
from rr_fakes.pins import TESTED_TRL
from rr_transformers.trl._supported import SUPPORTED

README = Path(__file__).parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## TRL's GRPOTrainer: `rr_transformers.trl`")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_states_the_one_line_and_the_range() -> None:
    section = " ".join(_section().split())
    assert "`import rr_transformers.trl; rr_transformers.trl.install()`" in section
    assert f"(TRL `{SUPPORTED['trl']}`, tested on {TESTED_TRL};" in section


def test_the_readme_names_every_patch_point() -> None:
    rows = re.findall(r"^\| `([^`]+)`(?:, `([^`]+)`)? \|", _section(), flags=re.MULTILINE)
    listed = {name for row in rows for name in row if name}
    try:
        hooked = set(rr_transformers.trl.install())  # the trainer's side
        armed = set(rr_transformers.trl.INSTALLER.arm_engine())  # a use_vllm=True trainer's
    finally:
        rr_transformers.trl.uninstall()
    assert hooked | armed == listed


def test_the_readme_names_the_logged_metrics() -> None:
    from rr_core import StepReport
    from rr_transformers.trl._passes import _figures

    figures = _figures(StepReport(agreement={2: 1.0}, order_agreement={2: 1.0}))
    section = _section()
    for name in [*(f"rr/train/{key}" for key in figures), "rr/seconds"]:
        assert f"`{name}`" in section, name


def _table_rows(header: list[str]) -> list[list[str]]:
    lines = _section().splitlines()
    start = lines.index(header[0])
    assert lines[start + 1] == header[1], lines[start + 1]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_readme_table_is_the_sessions_table() -> None:
    """The table is the one the session prints (``grpo_runs.table()``): its columns, every run
    of test_trl_grpo (two families, float32 and bfloat16 engine, rr off and replaying) and
    test_trl_grpo_r2 (R2's trainer runs), each step a row, and no pair routed differently in
    any replaying run."""
    import grpo_runs

    rows = _table_rows(grpo_runs.table().splitlines()[:2])  # an empty TABLE: the header
    steps: dict[tuple[str, str, str], list[str]] = {}
    for family, engine, rr, step, differ, *_ in rows:
        steps.setdefault((family, engine, rr), []).append(step)
        if rr == "replay":
            assert differ.startswith("0 / "), (family, engine, rr, step, differ)
    three = [str(n) for n in range(1, grpo_runs.STEPS + 1)]
    for family in ("qwen3_moe", "olmoe"):
        for engine in ("float32", "bfloat16"):
            for rr in ("off", "replay"):
                assert steps.pop((family, engine, rr)) == three, (family, engine, rr)
    assert steps.pop(("qwen3_moe", "trainer (R2)", "replay")) == three * 2  # on-policy, buffered
    assert steps.pop(("qwen3_moe", "trainer (R2)", "off")) == ["1"]
    assert not steps, steps
