"""Fake model builders: each field layout (A1-A6) is built as documented and walks as expected."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import ReplayController, ReplayMode, find_orphans, walk_routers
from rr_core.layout.pipeline import LayoutConfig, stage_layer_numbers
from rr_fakes._builders import (
    FakeModelConfig,
    build_hybrid_model,
    build_model,
    build_orphans_then_model,
    build_vpp_chunks,
    moe_pattern,
    routed_layer_numbers,
    vpp_chunk_layer_numbers,
)
from rr_fakes._models import FakeHashLayer, run_chunks
from rr_fakes._routers import FakeTopKRouter

TOKENS = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 0, 4]])


def walked(model: object) -> list[int]:
    return [layer for layer, _ in walk_routers(model)]  # type: ignore[arg-type]


def test_plain_decoder_runs_and_walks_every_layer() -> None:
    model = build_model(FakeModelConfig(num_layers=4))
    logits = model(TOKENS)
    assert logits.shape == (2, 5, 32)
    assert walked(model) == [1, 2, 3, 4] == list(model.moe_layer_numbers())
    assert model.routed_ids().shape == (10, 4, 2)
    logits.sum().backward()
    assert all(r.weight.grad is not None for r in model.routers())


def test_builds_are_deterministic_in_the_seed_only() -> None:
    torch.manual_seed(123)
    a = build_model(FakeModelConfig(seed=4))(TOKENS)
    torch.manual_seed(456)
    b = build_model(FakeModelConfig(seed=4))(TOKENS)
    c = build_model(FakeModelConfig(seed=5))(TOKENS)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_A1_orphans_are_registered_first_and_the_walk_finds_only_live_routers() -> None:
    config = FakeModelConfig(num_layers=3)
    model, registry = build_orphans_then_model(config)
    live = [router for _, router in walk_routers(model)]
    assert len(registry) == 6
    assert registry[3:] == live
    assert find_orphans(registry, walk_routers(model)) == registry[:3]
    # Orphans carry the live routers' weights, so positional addressing looks plausible.
    assert all(torch.equal(o.weight, r.weight) for o, r in zip(registry[:3], live, strict=True))


def test_A1_replay_reaches_the_live_routers_not_the_orphans() -> None:
    model, registry = build_orphans_then_model(FakeModelConfig(num_layers=2))
    ctrl = ReplayController(num_experts=6, top_k=2)
    try:
        layers = ctrl.attach(model)
        ctrl.set_mode(ReplayMode.REPLAY)
        target = torch.tensor([[0, 1]]).expand(10, 2, 2).contiguous()
        ctrl.arm(0, target, layer_numbers=layers)
        model(TOKENS)
        assert torch.equal(model.routed_ids(), target)
        ctrl.end_step()
        assert all(isinstance(r, FakeTopKRouter) and r.calls == 0 for r in registry[:2])
    finally:
        ctrl.detach()


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        (1, [1, 2, 3, 4, 5, 6]),
        (2, [1, 3, 5]),
        (3, [1, 4]),
        ([0, 0, 1, 1, 1, 1], [3, 4, 5, 6]),  # DeepSeek-V3's first_k_dense_replace=2 (A2)
        ([1, 0, 1, 0, 0, 1], [1, 3, 6]),
    ],
)
def test_A2_A3_moe_layer_freq_layouts(freq: int | list[int], expected: list[int]) -> None:
    config = FakeModelConfig(num_layers=6, moe_layer_freq=freq)
    model = build_model(config)
    assert walked(model) == expected == list(routed_layer_numbers(config))
    assert [i + 1 for i, moe in enumerate(moe_pattern(config)) if moe] == expected
    model(TOKENS)
    assert model.routed_ids().shape == (10, len(expected), 2)


@pytest.mark.parametrize("freq", [0, [1, 0], [1, 2, 0, 0]])
def test_bad_moe_layer_freq_raises(freq: int | list[int]) -> None:
    with pytest.raises(ValueError, match="moe_layer_freq"):
        FakeModelConfig(num_layers=4, moe_layer_freq=freq)


@pytest.mark.parametrize("flagged", [True, False])
def test_A4_mtp_layers_restart_at_one_and_are_not_walked(flagged: bool) -> None:
    config = FakeModelConfig(num_layers=3, mtp_layers=2, mtp_flagged=flagged)
    registry: list[torch.nn.Module] = []
    model = build_model(config, registry=registry)
    assert model.mtp is not None
    mtp_routers = [m for m in model.mtp.modules() if isinstance(m, FakeTopKRouter)]
    assert [r.layer_number for r in mtp_routers] == [1, 2]
    assert all(r.is_mtp_layer is flagged for r in mtp_routers)
    assert registry[3:] == mtp_routers  # decoder routers first, then MTP, like Megatron
    assert walked(model) == [1, 2, 3]
    model(TOKENS)
    assert model.last_mtp_logits is not None
    assert model.last_mtp_logits.shape == (10, 32)
    assert all(r.calls == 1 for r in mtp_routers)


def test_A5_hash_routed_first_layers_are_moe_but_have_no_router() -> None:
    config = FakeModelConfig(num_layers=5, hash_layers=2)
    model = build_model(config)
    hash_layers = [m for m in model.modules() if isinstance(m, FakeHashLayer)]
    assert [layer.layer_number for layer in hash_layers] == [1, 2]
    assert walked(model) == [3, 4, 5]
    model(TOKENS)
    first = hash_layers[0].last_ids_NK
    assert first is not None
    model(TOKENS.flip(-1))
    assert torch.equal(hash_layers[0].last_ids_NK, first.view(2, 5, 2).flip(1).reshape(10, 2))


def test_A5_more_hash_layers_than_moe_layers_raises() -> None:
    with pytest.raises(ValueError, match="hash_layers"):
        FakeModelConfig(num_layers=4, moe_layer_freq=2, hash_layers=3)


@settings(max_examples=20, deadline=None)
@given(order=st.permutations(range(5)), mixers=st.integers(0, 2))
def test_A6_hybrid_models_register_out_of_order_but_walk_in_layer_order(
    order: list[int], mixers: int
) -> None:
    config = FakeModelConfig(num_layers=5, moe_layer_freq=[1, 0, 1, 1, 0])
    model = build_hybrid_model(config, mixers_between=mixers, registration_order=order)
    module_order = [m.layer_number for m in model.modules() if isinstance(m, FakeTopKRouter)]
    assert sorted(module_order) == [1, 3, 4]
    assert walked(model) == [1, 3, 4]
    plain = build_model(config)
    if mixers == 0:  # same layers, same weights, run in layer order: same output
        assert torch.allclose(model(TOKENS), plain(TOKENS))


def test_A6_default_hybrid_registration_is_reversed() -> None:
    model = build_hybrid_model(FakeModelConfig(num_layers=4))
    module_order = [m.layer_number for m in model.modules() if isinstance(m, FakeTopKRouter)]
    assert module_order == [4, 3, 2, 1]
    assert walked(model) == [1, 2, 3, 4]


@pytest.mark.parametrize(("layers", "pp", "vp"), [(8, 2, 2), (12, 2, 3), (6, 3, 2), (4, 2, 1)])
def test_A3_vpp_chunks_match_rr_core_layout_and_the_full_model(
    layers: int, pp: int, vp: int
) -> None:
    config = FakeModelConfig(num_layers=layers, moe_layer_freq=2, mtp_layers=1)
    layout = LayoutConfig(num_layers=layers, pp_size=pp, vp_size=vp)
    by_stage = {}
    for rank in range(pp):
        numbers = vpp_chunk_layer_numbers(layers, pp_size=pp, vp_size=vp, pp_rank=rank)
        assert [tuple(n) for n in numbers] == [
            stage_layer_numbers(layout, rank, v) for v in range(vp)
        ]
        chunks = build_vpp_chunks(config, pp_size=pp, vp_size=vp, pp_rank=rank)
        expected = [n for chunk in numbers for n in chunk if n % 2 == 1]
        assert walked(chunks) == sorted(expected)
        for v, chunk in enumerate(chunks):
            by_stage[v * pp + rank] = chunk
    pipeline = [by_stage[i] for i in range(pp * vp)]
    assert pipeline[0].pre_process
    assert pipeline[-1].post_process
    assert sum(chunk.mtp is not None for chunk in pipeline) == 1
    full = build_model(config)
    assert torch.allclose(run_chunks(pipeline, TOKENS), full(TOKENS))


@pytest.mark.parametrize(("layers", "pp", "vp"), [(6, 2, 2), (4, 1, 2)])
def test_uneven_or_pipeline_less_vpp_split_raises(layers: int, pp: int, vp: int) -> None:
    with pytest.raises(ValueError, match="VPP"):
        vpp_chunk_layer_numbers(layers, pp_size=pp, vp_size=vp, pp_rank=0)
