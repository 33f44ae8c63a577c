"""``rr demo`` at a terminal: output paths checked before the run, the figures on a clean screen
(library warnings held back, shown with ``-v``), the figures printed before the plot is drawn,
and a plot whose labels read. ``run_demo`` is replaced by a stand-in that emits what the real
libraries emit, so these tests take a second, not the demo's minute."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rr_demo.chain
from rr_core.cli.main import main
from rr_demo import DemoResult
from rr_demo.cli import figure, render

LIBRARY_NOISE = (
    "Transformer Engine and Apex are not installed",
    "GPTModel IS DEPRECATED",
    "Triton is not available",
    "a stray print",
)


def fake_result() -> DemoResult:
    return DemoResult(
        megatron_core_version="0.19.2",
        vllm_objects="rr_fakes.emulations.engines._objects",
        mismatch_without_replay=0.12,
        mismatch_with_replay=0.0,
        kl_without_replay=7e-5,
        kl_with_replay=1e-14,
        logprob_abs_diff_without_replay=6e-3,
        logprob_abs_diff_with_replay=6e-8,
        bytes_per_token={"raw": 20.0, "packed": 10.0, "set": 6.9},
        record_file_bytes=2422,
        train_loss_with_replay=4.85,
        layers=[2, 3, 4, 5, 6],
        mismatch_per_layer_without_replay=[0.1, 0.15, 0.12, 0.0, 0.2],
        mismatch_per_layer_with_replay=[0.0] * 5,
        seconds=1.0,
    )


@pytest.fixture
def noisy_demo(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``run_demo`` as a stand-in that warns, logs and prints like megatron-core does; returns
    the list of stages it ran (empty: it was never called)."""
    calls: list[str] = []

    def run_demo(cfg: Any = None, *, progress: Callable[[str], None] = print) -> DemoResult:
        for stage in ("build", "roll out", "capture", "encode", "forward", "train"):
            calls.append(stage)
            progress(stage)
            warnings.warn("Transformer Engine and Apex are not installed.", UserWarning, 2)
            logging.getLogger("megatron.core.models.gpt").warning("GPTModel IS DEPRECATED.")
            print("Triton is not available", file=sys.stderr)
            print("a stray print")
        return fake_result()

    monkeypatch.setattr(rr_demo.chain, "run_demo", run_demo)
    return calls


def test_a_plot_into_a_missing_directory_is_refused_before_the_run(
    noisy_demo: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "missing" / "x.png"
    assert main(["demo", "--plot", str(out)]) == 2
    assert noisy_demo == []  # nothing ran
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"rr demo: --plot {out}: no such directory {out.parent}; create it first"
    )
    assert captured.out == ""
    assert main(["demo", "--plot", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert noisy_demo == []


def test_a_plot_without_matplotlib_is_refused_naming_the_extra(
    noisy_demo: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec

    def without_matplotlib(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_matplotlib)
    assert main(["demo", "--plot", str(tmp_path / "x.png")]) == 2
    assert noisy_demo == []
    assert capsys.readouterr().err.strip() == (
        "rr demo: --plot needs matplotlib: pip install 'rr-demo[plot]'"
    )


def test_the_screen_holds_the_figures_and_the_bar_only(
    noisy_demo: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo"]) == 0
    captured = capsys.readouterr()
    assert captured.out == render(fake_result()) + "\n"
    for noise in LIBRARY_NOISE:
        assert noise not in captured.err
    assert "rr demo: 100%" in captured.err  # the progress bar
    assert captured.err.rstrip().endswith("(4 library messages hidden; -v shows them)")


def test_verbose_shows_each_library_message_once_after_the_bar(
    noisy_demo: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "-v"]) == 0
    err = capsys.readouterr().err
    shown = err[err.index("library messages during the run (4):") :]
    for noise in LIBRARY_NOISE:
        assert shown.count(noise) == 1  # six stages, each message once
    assert "rr demo" not in shown  # not interleaved with the bar


def test_json_stays_parseable_with_noisy_libraries(
    noisy_demo: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert main(["demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mismatch_with_replay"] == 0.0


def test_the_figures_are_printed_before_the_plot_is_drawn(
    noisy_demo: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    import rr_demo.cli

    seen: list[str] = []
    draw = rr_demo.cli.plot

    def plot(result: Any, path: str) -> None:
        seen.append(capsys.readouterr().out)
        draw(result, path)

    monkeypatch.setattr(rr_demo.cli, "plot", plot)
    out = tmp_path / "mismatch.png"
    assert main(["demo", "--plot", str(out)]) == 0
    assert seen == [render(fake_result()) + "\n"]
    assert out.read_bytes().startswith(b"\x89PNG")
    assert capsys.readouterr().out == f"plot written to {out}\n"


def test_the_plot_names_layers_and_labels_the_zero_bars_of_replay() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = figure(fake_result())
    try:
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "3", "4", "5", "6"]
        assert [t.get_text() for t in ax.texts] == ["0%"] * 5  # each replay bar is 0
        assert ax.get_ylabel() == "tokens routed differently"
        assert ax.get_xlabel().startswith("MoE layer")
    finally:
        plt.close(fig)


def test_an_unknown_engine_name_is_an_rr_error_naming_the_choices() -> None:
    from rr_core import RRError
    from rr_demo.chain import choose_engine

    with pytest.raises(RRError, match=r"engine 'sglang'; choose one of auto, vllm, emulated"):
        choose_engine("sglang")
    choice = choose_engine("emulated")
    assert (choice.engine, choice.reason) == ("emulated", "chosen with --engine emulated")
