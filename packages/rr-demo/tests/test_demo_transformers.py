"""The demo's chain on a real transformers MoE model: noisy rollouts, capture as vLLM returns
it, decode, then the transformers trainer without and with R3 replay through rr_transformers.
Runs where transformers is installed; needs no megatron (and imports none)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("rr_transformers")

import rr_transformers
from rr_core.cli.main import main
from rr_demo import DemoResult, TransformersDemoConfig, run_demo
from rr_demo.cli import render
from rr_demo.trainer_transformers import demo_families

#: Per family, an engine noise in the units its router's top-k sees (probabilities for
#: qwen3_moe, sigmoid scores plus bias for deepseek_v3, raw logits for gpt_oss).
NOISE = {"qwen3_moe": 0.02, "deepseek_v3": 0.02, "gpt_oss": 0.2}


@functools.cache
def demo(family: str) -> DemoResult:
    return run_demo(
        TransformersDemoConfig(family=family, noise=NOISE[family], batch=3, new_tokens=5)
    )


@pytest.mark.parametrize("family", sorted(NOISE))
def test_replay_removes_every_routing_difference_on_a_transformers_model(family: str) -> None:
    """Softmax, group-limited sigmoid with expert bias, and top-k-then-softmax routers."""
    if family not in demo_families():
        pytest.skip(f"{family} needs a newer transformers")
    result = demo(family)
    assert result.backend == "transformers"
    assert result.model_type == family
    assert result.transformers_version == str(rr_transformers.installed_transformers_version())
    assert result.megatron_core_version is None
    assert result.mismatch_without_replay > 0  # the engine's numerics moved routes
    assert result.mismatch_with_replay == 0.0  # read from what each layer's experts received
    assert result.mismatch_per_layer_with_replay == [0.0] * len(result.layers)
    assert result.kl_with_replay < result.kl_without_replay / 100
    assert result.logprob_abs_diff_with_replay < result.logprob_abs_diff_without_replay / 100
    sizes = result.bytes_per_token
    assert sizes["set"] < sizes["packed"] < sizes["raw"]
    assert result.train_loss_with_replay > 0
    assert not rr_transformers.is_installed()  # the demo removed the hooks it installed


def test_the_layers_are_the_routed_decoder_layers() -> None:
    """qwen3_moe's tiny model has a dense first layer: the routed layers are 2 and 3 of the
    all-layers axis, and the overall figure is the per-layer ones averaged."""
    result = demo("qwen3_moe")
    assert result.layers == [2, 3]
    per_layer = result.mismatch_per_layer_without_replay
    assert result.mismatch_without_replay == pytest.approx(sum(per_layer) / len(per_layer))


def test_the_table_names_transformers_and_the_family() -> None:
    result = demo("qwen3_moe")
    lines = render(result).splitlines()
    assert lines[0].split() == ["transformers", result.transformers_version, "qwen3_moe"]
    rows = {line.split("  ")[0] for line in lines}
    for row in (
        "expert sets differing from rollout",
        "mean |delta log p| of sampled tokens",
        "KL(rollout || trainer), k3",
        "training step under replay (loss)",
        "route bytes per token, packed",
    ):
        assert row in rows
    (differing,) = [line for line in lines if line.startswith("expert sets differing")]
    assert differing.split()[-2:] == [f"{result.mismatch_without_replay:.2%}", "0.00%"]
    assert "megatron" not in render(result)


def test_hooks_installed_before_the_demo_stay_installed() -> None:
    rr_transformers.install()
    try:
        run_demo(TransformersDemoConfig(batch=1, new_tokens=2))
        assert rr_transformers.is_installed()
    finally:
        rr_transformers.uninstall()


def test_rr_demo_backend_transformers_json_imports_no_megatron() -> None:
    """The command in a fresh process, which fails if megatron-core, the Megatron harness or
    the demo's Megatron backend was imported (rr's CLI reads every adapter's version data)."""
    pytest.importorskip("tqdm")
    code = (
        "import sys; from rr_core.cli.main import main; rc = main(sys.argv[1:]); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'megatron' or "
        "m.startswith(('rr_fakes.shims.megatron', 'rr_demo.trainer_megatron'))); "
        "sys.exit('imported ' + ' '.join(bad) if bad else rc)"
    )
    args = ["demo", "--backend", "transformers", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["backend"] == "transformers"
    assert report["model_type"] == "qwen3_moe"
    assert report["mismatch_with_replay"] == 0.0
    assert report["mismatch_without_replay"] > 0
    assert set(report["bytes_per_token"]) == {"raw", "packed", "set"}


def test_an_unknown_family_is_refused_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "transformers", "--family", "llama"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # refused before the progress bar
    assert line.startswith("rr demo: --family llama: no demo model; choose one of ")
    assert "qwen3_moe" in line.split("choose one of ")[1].split(", ")
    assert main(["demo", "--family", "mixtral"]) == 2  # the megatron backend has no families
    assert "--family needs --backend transformers" in capsys.readouterr().err
