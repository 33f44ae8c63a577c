"""``rr demo --loop``: two GRPO steps of TRL's own GRPOTrainer on vLLM's CPU build, without and
with rr (``nox -s trl`` installs both). With rr no (token, MoE layer) pair of the training
forward is routed differently from the bfloat16 engine; without rr some are; the table is
printed and carried by the plot file. The flag checks run wherever rr-demo is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rr_core.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "2"], "--steps needs --loop"),
        (["--loop", "--steps", "0"], "--steps must be at least 1, got 0"),
        (
            ["--loop", "--backend", "transformers"],
            "--loop trains with TRL on vLLM; --backend and --engine do not apply",
        ),
        (
            ["--loop", "--engine", "emulated"],
            "--loop trains with TRL on vLLM; --backend and --engine do not apply",
        ),
        (
            ["--loop", "--family", "mixtral"],
            "--loop --family mixtral: choose one of qwen3_moe, olmoe",
        ),
    ],
)
def test_loop_flags_are_checked_before_the_run(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"rr demo: {message}"


def test_loop_trains_two_steps_without_and_with_rr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rr_demo import loop

    problem = loop.problem()
    if problem is not None:
        pytest.skip(f"rr demo --loop cannot run here: {problem}")
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (rr-demo[plot])")
    png = tmp_path / "loop.png"

    assert main(["demo", "--loop", "--steps", "2", "--json", "--plot", str(png)]) == 0

    result = json.loads(capsys.readouterr().out)
    off = [s for s in result["steps"] if not s["replay"]]
    on = [s for s in result["steps"] if s["replay"]]
    assert [s["step"] for s in off] == [1, 2], off
    assert [s["step"] for s in on] == [1, 2], on
    assert all(s["pairs"] > 0 for s in result["steps"]), result["steps"]
    assert [s["differ"] for s in on] == [0, 0], f"expected no pair routed differently: {on}"
    assert any(s["differ"] > 0 for s in off), f"expected a bf16 engine to differ: {off}"
    for s in result["steps"]:  # TRL's own metrics and rr's time were read for every step
        assert 0 < s["logp_mean"] <= s["logp_max"], s
        assert s["rr_seconds"] >= 0, s
    assert result["peak_rss_mib"] > 0
    assert result["seconds"] > 0

    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG"
        table = image.text["Description"]
    rows = [line.split() for line in table.splitlines()[2:-1]]
    assert [(r[0], r[1]) for r in rows] == [("off", "1"), ("off", "2"), ("replay", "1"),
                                            ("replay", "2")], table  # fmt: skip
    assert [r[2] for r in rows[2:]] == [f"0/{s['pairs']}" for s in on], table
    assert [r[2] for r in rows[:2]] == [f"{s['differ']}/{s['pairs']}" for s in off], table


def test_loop_trains_olmoe_with_family(capsys: pytest.CaptureFixture[str]) -> None:
    """``--family olmoe``: the tiny OLMoE checkpoint (every layer MoE), one step each run; with
    rr no pair of its training forward is routed differently from the engine."""
    from rr_demo import loop

    problem = loop.problem()
    if problem is not None:
        pytest.skip(f"rr demo --loop cannot run here: {problem}")

    assert main(["demo", "--loop", "--family", "olmoe", "--steps", "1", "--json"]) == 0

    result = json.loads(capsys.readouterr().out)
    assert result["family"] == "olmoe", result["family"]
    assert [(s["replay"], s["step"]) for s in result["steps"]] == [(False, 1), (True, 1)]
    on = result["steps"][1]
    assert on["pairs"] > 0, on
    assert on["differ"] == 0, f"expected no pair routed differently: {on}"
