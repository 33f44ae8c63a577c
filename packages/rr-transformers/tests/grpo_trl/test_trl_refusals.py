"""What rr_transformers.trl refuses by name, its install life cycle, and how it lays a
batch's routes on TRL's rows (no engine runs here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from packaging.version import Version

import rr_transformers
import rr_transformers.trl
from rr_core import RouteMeta
from rr_transformers.trl import RowRoutes, TrlReplayError
from rr_transformers.trl import _adapter as adapter
from rr_transformers.trl._rows import chunk_batch

META = RouteMeta(
    num_experts=8, top_k=2, layer_axis="all_layers", layer_numbers=(1, 2), moe_layer_numbers=(2,)
)


def _config(**overrides: Any) -> Any:
    return SimpleNamespace(**{"use_vllm": True, "vllm_mode": "colocate", **overrides})


def _refuse(config: Any, **extra: Any) -> None:
    adapter.refusals(
        config,
        **{"tools": None, "rollout_func": None, "environment_factory": None, **extra},
    )


def test_the_plain_colocate_trainer_is_accepted() -> None:
    _refuse(_config())


def test_a_trainer_generating_with_its_own_model_is_accepted_for_r2() -> None:
    _refuse(_config(use_vllm=False, vllm_mode="server"))  # vllm_mode unused without vLLM


@pytest.mark.parametrize(
    ("config", "extra", "match"),
    [
        (_config(vllm_mode="server"), {}, "vllm_mode='server'"),
        (_config(), {"rollout_func": lambda prompts, trainer: {}}, "rollout_func"),
        (_config(), {"tools": [print]}, "tools="),
        (_config(), {"environment_factory": object}, "environment_factory"),
    ],
)
def test_what_rr_cannot_replay_is_refused_by_name(config: Any, extra: Any, match: str) -> None:
    with pytest.raises(TrlReplayError, match=match):
        _refuse(config, **extra)


def test_install_is_idempotent_and_uninstall_restores() -> None:
    from trl.trainer.grpo_trainer import GRPOTrainer

    original = GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]
    assert not rr_transformers.trl.is_installed()
    try:
        first = rr_transformers.trl.install()
        assert rr_transformers.trl.install() == first
        assert rr_transformers.trl.is_installed()
        assert rr_transformers.is_installed()
        assert GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is not original
    finally:
        rr_transformers.trl.uninstall()
    assert not rr_transformers.trl.is_installed()
    assert not rr_transformers.is_installed()  # install() put them in: uninstall takes them out
    assert GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is original
    assert rr_transformers.trl.uninstall() == 0


def test_a_trl_outside_the_tested_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "installed_trl_version", lambda: Version("1.17.0"))
    with pytest.raises(TrlReplayError, match=r"trl 1.17.0 is outside the tested range"):
        rr_transformers.trl.install()
    assert not rr_transformers.trl.is_installed()
    try:
        assert rr_transformers.trl.install(force=True)  # hooks it anyway
        assert rr_transformers.trl.is_installed()
    finally:
        rr_transformers.trl.uninstall()


def test_a_server_mode_trainer_is_refused_before_it_connects() -> None:
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(output_dir="unused", use_vllm=True, vllm_mode="server", use_cpu=True)
    rr_transformers.trl.install()
    try:
        with pytest.raises(TrlReplayError, match="vllm_mode='server'"):
            GRPOTrainer(model="unused", reward_funcs=[], args=config)
    finally:
        rr_transformers.trl.uninstall()


def test_set_replay_needs_a_trainer_built_under_install() -> None:
    with pytest.raises(TrlReplayError, match=r"not built under rr_transformers\.trl\.install"):
        rr_transformers.trl.set_replay(object(), False)


def _row(tokens: list[int]) -> RowRoutes:
    n = len(tokens) - 1  # the engine's T-1 rows
    values = torch.zeros(n, 2, 2, dtype=torch.uint8)
    values[:, 1, 0], values[:, 1, 1] = 3, 5
    return RowRoutes(torch.tensor(tokens), values, torch.ones(n, dtype=torch.bool), META)


def test_routes_lay_on_their_rows_left_and_right_padded() -> None:
    rows = [_row([7, 8, 9, 10]), _row([11, 12, 13, 14, 15])]
    ids = torch.tensor([[0, 7, 8, 9, 10, 0], [11, 12, 13, 14, 15, 0]])
    mask = (ids != 0).long()
    batch = chunk_batch(rows, ids, mask)
    assert batch.lengths.tolist() == [3, 4]
    assert bool(batch.valid_N.all())


def test_routes_of_another_row_raise() -> None:
    rows = [_row([7, 8, 9, 10]), _row([11, 12, 13, 14])]
    ids = torch.tensor([[11, 12, 13, 14], [7, 8, 9, 10]])
    with pytest.raises(TrlReplayError, match="row 0 of the forward"):
        chunk_batch(rows, ids, torch.ones_like(ids))
    with pytest.raises(TrlReplayError, match="2 routes"):
        chunk_batch(rows, ids[:1], torch.ones_like(ids[:1]))


def test_a_masked_truncated_completion_routes_natively() -> None:
    """``mask_truncated_completions``: TRL zeroes the completion's attention; its prompt rows
    stay, none replayed."""
    rows = [_row([7, 8, 9, 10, 11])]  # prompt 7 8, completion 9 10 11 (truncated)
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 0, 0, 0]])
    batch = chunk_batch(rows, ids, mask)
    assert batch.lengths.tolist() == [2]
    assert not bool(batch.valid_N.any())


def test_r2_with_an_adapter_off_reference_is_refused_by_name() -> None:
    """A PEFT policy with ``beta != 0``: TRL's reference forward is the policy's own module."""
    trainer = SimpleNamespace()

    def init(args: Any = None) -> None:
        trainer.beta, trainer.ref_model = 0.04, None

    with pytest.raises(TrlReplayError, match=r"PEFT policy and beta != 0"):
        adapter._init(init, trainer, (), {"args": _config(use_vllm=False)})
    trainer_with_ref = type("Trainer", (), {})()  # weak-referenceable, as a trainer is

    def init_with_ref(args: Any = None) -> None:
        trainer_with_ref.beta, trainer_with_ref.ref_model = 0.04, object()

    adapter._init(init_with_ref, trainer_with_ref, (), {"args": _config(use_vllm=False)})


def test_a_trainer_without_a_grpo_config_is_refused_by_name() -> None:
    def init(model: Any = None, args: Any = None) -> None:
        raise AssertionError("TRL's __init__ ran before rr checked its config")

    with pytest.raises(TrlReplayError, match=r"GRPOTrainer without args: rr needs a GRPOConfig"):
        adapter._init(init, type("Trainer", (), {})(), ("model",), {})


def test_an_image_batch_is_refused_at_the_forward() -> None:
    """A vision-language batch: rr lays routes over text rows only."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rr_transformers.trl import _passes

    trainer = type("Trainer", (), {})()
    _passes.STATES[trainer] = _passes.TrainerState(replay=True)
    method = GRPOTrainer._get_per_token_logps_and_entropies.__get__(trainer)  # TRL's signature
    ids = torch.ones(1, 4, dtype=torch.long)
    call = {"model": None, "input_ids": ids, "attention_mask": ids, "logits_to_keep": 2}
    with pytest.raises(TrlReplayError, match=r"carries \['pixel_values'\].*not supported"):
        _passes.per_token_logps(method, trainer, (), {**call, "pixel_values": torch.zeros(1)})


def test_an_engine_built_before_install_is_refused_in_the_rollout() -> None:
    """TRL's ``LLM`` built before ``install()``: its answers carry no routes."""
    from rr_transformers.trl import _engine

    token = _engine._ROLLOUT.set(_engine.Rollout())  # inside TRL's VLLMGeneration.generate
    try:
        with pytest.raises(TrlReplayError, match=r"built before rr_transformers\.trl\.install"):
            _engine.llm_generate(lambda *a, **k: [], type("LLM", (), {})(), (), {})
    finally:
        _engine._ROLLOUT.reset(token)
