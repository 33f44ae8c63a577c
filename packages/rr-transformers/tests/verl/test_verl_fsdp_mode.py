"""``router_replay.mode`` as a verl user states it reaches rr: the plain dict verl's own
``omega_conf_to_dataclass`` leaves for a Hydra ``+fsdp_config.router_replay.mode=R3``, an
omegaconf DictConfig, and verl's Megatron, VeOmni and actor dataclasses; spellings verl would
not take are refused by name, and routes reaching an engine whose replay is off are said."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")

from omegaconf import DictConfig, OmegaConf

import rr_transformers
import rr_transformers.verl as rr_verl
from rr_core import RRWarning
from rr_fakes import distinct_ids
from rr_fakes.shims.hf_models import NUM_EXPERTS, TOP_K, VOCAB
from rr_fakes.shims.verl._batch import run_step, verl_batch
from rr_fakes.shims.verl._fsdp import fsdp_cpu, fsdp_engine
from rr_transformers.verl._mode import read_mode

PROMPTS, RESPONSES = (3, 5, 4, 6), (2, 3, 4, 2)
LENGTHS = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]


def _as_verl_builds(target: str, router_replay: dict[str, Any]) -> Any:
    """``router_replay`` as verl's own config conversion hands it to an engine of ``target``."""
    from verl.utils.config import omega_conf_to_dataclass

    config = OmegaConf.create({"_target_": target, "router_replay": router_replay})
    return omega_conf_to_dataclass(config).router_replay


def _fsdp_override(mode: str) -> Any:
    """What ``+actor_rollout_ref.actor.fsdp_config.router_replay.mode=<mode>`` becomes."""
    return _as_verl_builds("verl.workers.config.FSDPEngineConfig", {"mode": mode})


def _actor_config(mode: str) -> Any:
    from verl.workers.config import RouterReplayConfig

    return RouterReplayConfig(mode=mode)


def test_the_fsdp_override_arrives_as_a_plain_dict_and_is_read() -> None:
    form = _fsdp_override("R3")
    assert type(form) is dict  # verl's FSDP yaml has no router_replay _target_
    assert read_mode(form) == "R3"


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda: {"mode": "R3"}, id="dict"),
        pytest.param(lambda: OmegaConf.create({"mode": "R3"}), id="DictConfig"),
        pytest.param(
            lambda: _as_verl_builds(
                "verl.workers.config.McoreEngineConfig",
                {"_target_": "verl.workers.config.EngineRouterReplayConfig", "mode": "R3"},
            ),
            id="megatron",
        ),
        pytest.param(
            lambda: _as_verl_builds(
                "verl.workers.config.VeOmniEngineConfig",
                {"_target_": "verl.workers.config.EngineRouterReplayConfig", "mode": "R3"},
            ),
            id="veomni",
        ),
        pytest.param(lambda: _actor_config("R3"), id="actor"),
    ],
)
def test_every_form_of_the_setting_is_read(form: Any) -> None:
    assert read_mode(form()) == "R3"


@pytest.mark.parametrize("form", [None, {}, OmegaConf.create({})])
def test_an_absent_mode_is_disabled(form: Any) -> None:
    assert read_mode(form) == "disabled"


@pytest.mark.parametrize("spelling", ["r3", " R3", "R3 ", "Disabled"])
def test_spellings_verl_does_not_take_are_refused_by_name(spelling: str) -> None:
    canonical = {"r3": "R3", " R3": "R3", "R3 ": "R3", "Disabled": "disabled"}[spelling]
    with pytest.raises(rr_verl.VerlFSDPReplayError, match=f"write '{canonical}'"):
        read_mode({"mode": spelling})


@pytest.mark.parametrize("value", ["R4", 3, None, ["R3"]])
def test_other_modes_are_refused_naming_what_came(value: Any) -> None:
    with pytest.raises(rr_verl.VerlFSDPReplayError, match="must be one of"):
        read_mode({"mode": value})


def test_a_setting_of_another_shape_is_refused() -> None:
    with pytest.raises(rr_verl.VerlFSDPReplayError, match="got str 'R3'"):
        read_mode("R3")  # router_replay=R3 instead of router_replay.mode=R3


@pytest.fixture
def verl_cpu() -> Iterator[list[Any]]:
    built: list[Any] = []
    with fsdp_cpu():
        rr_verl.ADAPTER.install()
        yield built
        for engine in built:
            controller = rr_verl.controller_of(engine.module)
            if controller is not None:
                rr_verl.detach(controller)
        rr_verl.uninstall()
        rr_transformers.uninstall()


def _engine(built: list[Any], router_replay: Any, **config: Any) -> Any:
    """A qwen3_moe FSDP engine whose config holds ``router_replay`` in the form given (and
    ``config``'s fields, set after the CPU harness built it)."""
    engine = fsdp_engine("qwen3_moe")
    engine.engine_config = dataclasses.replace(
        engine.engine_config, router_replay=router_replay, **config
    )
    built.append(engine)
    return engine


def _routes() -> list[Any]:
    return [distinct_ids(n - 1, 2, num_experts=NUM_EXPERTS, top_k=TOP_K, seed=n) for n in LENGTHS]


def _batch(routes: Any) -> Any:
    return verl_batch(
        PROMPTS, RESPONSES, VOCAB, routed_experts=routes, micro_batch_size=2,
        enable_routing_replay=True, extra={"use_remove_padding": True},
    )  # fmt: skip


@pytest.mark.parametrize("form", ["dict", "DictConfig"])
def test_an_engine_configured_by_a_mapping_replays(verl_cpu: list[Any], form: str) -> None:
    router_replay = _fsdp_override("R3")
    if form == "DictConfig":
        router_replay = OmegaConf.create(router_replay)
        assert isinstance(router_replay, DictConfig)
    engine = _engine(verl_cpu, router_replay)
    run_step(engine, _batch(_routes()), forward_only=True)
    report = rr_verl.last_report(engine.module)
    assert report is not None
    assert report.replayed_microbatches == (0, 1)


def test_routes_reaching_an_engine_whose_replay_is_off_are_said_once(
    verl_cpu: list[Any],
) -> None:
    engine = _engine(verl_cpu, _fsdp_override("disabled"))
    with pytest.warns(RRWarning, match=r"router_replay\.mode reads 'disabled'.*mode=R3"):
        run_step(engine, _batch(_routes()), forward_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_step(engine, _batch(_routes()), forward_only=True)  # once per engine
    assert rr_verl.last_report(engine.module) is None


def test_a_forward_only_engine_routes_natively_without_a_word(verl_cpu: list[Any]) -> None:
    engine = _engine(verl_cpu, {}, forward_only=True)  # verl's reference policy
    with warnings.catch_warnings():
        warnings.simplefilter("error", RRWarning)
        run_step(engine, _batch(_routes()), forward_only=True)
