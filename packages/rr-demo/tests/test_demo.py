"""The demo's chain on every line: rollout with noisy routing, capture as vLLM returns it,
decode, compress, store, then the real trainer without and with R3 replay."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from rr_demo import DemoConfig, run_demo
from rr_fakes.shims.megatron import MEGATRON_LINES, route_log


def test_demo_replay_removes_every_routing_difference_and_the_logprob_gap() -> None:
    pytest.importorskip("rr_vllm")
    result = run_demo(DemoConfig(batch=3, new_tokens=6))
    assert result.mismatch_without_replay > 0.02  # the engine's numerics moved routes
    assert result.mismatch_with_replay == 0.0  # measured from the routers' own routing maps
    assert result.mismatch_per_layer_with_replay == [0.0] * len(result.layers)
    assert result.kl_with_replay < result.kl_without_replay / 100
    assert result.logprob_abs_diff_with_replay < 1e-5
    sizes = result.bytes_per_token
    assert sizes["set"] < sizes["packed"] < sizes["raw"]
    assert result.train_loss_with_replay > 0


def test_rr_demo_json_has_the_documented_keys() -> None:
    """The command itself, on the line the demo is run with (the newest)."""
    pytest.importorskip("rr_vllm")
    pytest.importorskip("tqdm")
    newest = MEGATRON_LINES[list(MEGATRON_LINES)[-1]][0]
    if version("megatron-core") != newest:
        pytest.skip(f"rr demo runs on megatron-core {newest}")
    code = "import sys; from rr_core.cli.main import main; sys.exit(main(['demo', '--json']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    for key in (
        "megatron_core_version",
        "mismatch_without_replay",
        "mismatch_with_replay",
        "kl_without_replay",
        "kl_with_replay",
        "bytes_per_token",
    ):
        assert key in report
    assert set(report["bytes_per_token"]) == {"raw", "packed", "set"}


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.split()[0] == "0.0"


def test_the_megatron_step_replays_the_rollout_in_forward_and_recompute() -> None:
    """The training step runs through Megatron's schedule with the forward step wrapped by
    rr_megatron_compat.replay_forward_step: every decoder router uses the rollout's experts on
    every routed row, in the forward and again in the activation recompute of backward."""
    pytest.importorskip("rr_vllm")
    from rr_demo.chain import padded_batch
    from rr_demo.engine_emulated import emulated_rollout
    from rr_demo.report import mismatch_per_layer
    from rr_demo.trainer_megatron import open_trainer
    from rr_vllm import DecodeOptions, decode_vllm_output

    cfg = DemoConfig(batch=2, new_tokens=4, noise=0.05)
    with open_trainer(cfg, lambda stage: None) as trainer:
        out = emulated_rollout(trainer, cfg)
        options = DecodeOptions(meta=out.meta)
        decoded = decode_vllm_output(out.request_outputs, options, prompt_starts=out.prompt_starts)
        batch = decoded.to_batch()
        padded = padded_batch(out, batch)
        native, _ = trainer.trainer_forward(padded, replay=False)
        with route_log(trainer.model) as log:
            loss = trainer.train_step(padded)
    B, S = padded.ids_BS.shape
    assert sorted(log.recompute) == sorted(log.forward) == list(out.meta.routed_layer_numbers)
    for phase in (log.forward, log.recompute):
        used = {layer: maps[-1].reshape(S, B, -1).transpose(0, 1) for layer, maps in phase.items()}
        assert mismatch_per_layer(used, padded.routes_BSLK, padded.valid_BS) == [0.0] * len(used)
    # the rollout's noise moved routes, so a step that routed natively would have failed above
    assert max(mismatch_per_layer(native, padded.routes_BSLK, padded.valid_BS)) > 0
    assert loss > 0
