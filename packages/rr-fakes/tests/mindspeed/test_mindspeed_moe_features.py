"""The emulated MindSpeed's MoE features (features_manager/moe): ``fix_router`` per line and
``moe_tp_extend_ep``'s routing and MoE layer, what each line reaches and refuses."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import pytest
import torch
from stub_targets import STUB, STUBS, tiny_config

from rr_fakes.emulations.mindspeed import (
    PRE_PATCH_LINES,
    emulated_mindspeed,
)


# -- features_manager/moe -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "args", "registered"),
    [
        ("0.12", {"fix_router": True, "expert_model_parallel_size": 2}, True),
        ("0.12", {"moe_expert_capacity_factor": 1.0}, True),  # either flag on 0.12
        ("0.16", {"fix_router": True}, False),  # no fix-router feature on 0.16
        ("0.17", {"moe_expert_capacity_factor": 1.0}, False),
        ("0.17", {"fix_router": True, "optimization_level": 1}, False),  # level 2 there
        ("0.18", {"fix_router": True}, True),
    ],
)
def test_fix_router_registration_per_line(
    line: str, args: dict[str, Any], registered: bool, stub: types.ModuleType
) -> None:
    target = f"{STUB}.topk_softmax_with_capacity"
    with emulated_mindspeed(line=line, targets=STUBS, args=args, import_adaptor=True) as ms:
        assert (ms.patch(target) is not None) is registered


def test_fix_router_selects_normally_then_overrides_with_arange(stub: types.ModuleType) -> None:
    logits = torch.randn(6, 4)
    native = torch.topk(torch.softmax(logits, -1), 2, dim=-1).indices.sort(-1).values
    args = {"moe_expert_capacity_factor": 1.0}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True) as ms:
        copier = sys.modules["rr_fakes_stub_copier"]
        _, routing_map, _ = copier.topk_softmax_with_capacity(logits, 2, use_pre_softmax=True)
        assert ms.bypass_calls == ["topk_softmax_with_capacity"]
        kept = routing_map.nonzero()
        assert all(int(e) in native[int(t)].tolist() for t, e in kept)  # normal selection
        ms.args.fix_router = True  # the override reads the global flag at each call
        _, routing_map, _ = stub.topk_softmax_with_capacity(logits, 2, capacity_factor=None)
        expected = (torch.arange(12).view(6, 2) % 4).sort(-1).values
        assert torch.equal(routing_map.nonzero()[:, 1].view(6, 2), expected)
        with pytest.raises(AssertionError, match="expert_model_parallel_size"):
            tiny_config()  # fix_router with EP=1 fails the validation in __post_init__


@pytest.mark.parametrize(
    ("args", "routing", "moe_layer"),
    [
        ({"moe_tp_extend_ep": True, "moe_token_dispatcher_type": "alltoall_seq"}, True, True),
        (
            {
                "moe_tp_extend_ep": True,
                "moe_token_dispatcher_type": "alltoall_seq",
                "moe_alltoall_overlap_comm": True,
            },
            True,
            False,
        ),
        ({"moe_tp_extend_ep": True, "moe_token_dispatcher_type": "alltoall"}, False, False),
        (
            {
                "moe_tp_extend_ep": True,
                "moe_token_dispatcher_type": "alltoall_seq",
                "optimization_level": 1,
            },
            False,
            False,
        ),
    ],
)
@pytest.mark.parametrize("line", PRE_PATCH_LINES)
def test_tp_extend_ep_replaces_routing_and_moe_layer(
    line: str, args: dict[str, Any], routing: bool, moe_layer: bool, stub: types.ModuleType
) -> None:
    base = stub.MoELayer
    with emulated_mindspeed(line=line, targets=STUBS, args=args, import_adaptor=True) as ms:
        assert (ms.patch(f"{STUB}.TopKRouter.routing") is not None) is routing
        assert (stub.MoELayer is not base) is moe_layer
        if moe_layer:
            assert issubclass(stub.MoELayer, base)
        if routing:
            probs, routing_map = stub.TopKRouter().routing(torch.randn(5, 8))
            assert ms.bypass_calls == ["TopKRouter.routing"]
            assert routing_map.sum(-1).tolist() == [2] * 5
            assert torch.equal(routing_map, probs > 0)
    assert stub.MoELayer is base
    assert stub.TopKRouter().routing(None) == "original routing"


@pytest.mark.parametrize("line", PRE_PATCH_LINES)
def test_tp_extend_ep_routing_has_megatrons_two_parameters(
    line: str, stub: types.ModuleType
) -> None:
    with emulated_mindspeed(line=line, targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True):
        routing = stub.TopKRouter.routing
        assert routing.__name__ == "routing_tp_extend_ep"
        assert list(inspect.signature(routing).parameters) == ["self", "logits"]
        with pytest.raises(TypeError, match="padding_mask"):  # what Megatron 0.16+ passes
            stub.TopKRouter().routing(torch.randn(4, 8), padding_mask=None)


def test_tp_extend_ep_on_012_reaches_the_router_modules_top_k_only_with_aux_loss(
    stub: types.ModuleType,
) -> None:
    with emulated_mindspeed(
        line="0.12", targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True
    ) as ms:
        router = stub.TopKRouter()
        router.routing(torch.randn(4, 8))
        assert stub.SELECTED == ["router module's top-k"]  # via aux_loss_load_balancing
        traced: list[str] = []
        stub.topk_softmax_with_capacity = lambda *a, **k: traced.append("hook")  # a later hook
        router.routing_type = "none"
        _, routing_map = router.routing(torch.randn(4, 8))
        assert traced == []  # MindSpeed's own import, bound when it registered
        assert stub.SELECTED == ["router module's top-k"] * 2
        assert routing_map.sum(-1).tolist() == [2] * 4
        router.routing_type = "seq_aux_loss"
        with pytest.raises(ValueError, match="Unsupported MoE routing type"):
            router.routing(torch.randn(4, 8))
        assert ms.bypass_calls == ["TopKRouter.routing"] * 3


def test_tp_extend_ep_on_016_has_no_top_k_of_its_own(stub: types.ModuleType) -> None:
    with emulated_mindspeed(line="0.16", targets=STUBS, moe_tp_extend_ep=True, import_adaptor=True):
        router = stub.TopKRouter()
        router.routing_type = "none"
        with pytest.raises(NameError, match="topk_softmax_with_capacity"):
            router.routing(torch.randn(4, 8))


@pytest.mark.parametrize("line", ["0.17", "0.18"])
def test_tp_extend_ep_cannot_import_on_017_and_018(line: str, stub: types.ModuleType) -> None:
    flag = {"moe_tp_extend_ep": True}
    with (
        emulated_mindspeed(line=line, targets=STUBS, args=flag) as ms,
        pytest.raises(ModuleNotFoundError, match="legacy_a2a_token_dispatcher"),
    ):
        ms.import_adaptor()
    level_1 = {"moe_tp_extend_ep": True, "optimization_level": 1}  # the feature does not apply
    with emulated_mindspeed(line=line, targets=STUBS, args=level_1, import_adaptor=True) as ms:
        assert ms.patch(f"{STUB}.TopKRouter.routing") is None


def test_tp_extend_ep_validation_reads_training_arguments(stub: types.ModuleType) -> None:
    args = {"moe_tp_extend_ep": True}
    with emulated_mindspeed(line="0.12", targets=STUBS, args=args, import_adaptor=True) as ms:
        with pytest.raises(AttributeError, match="num_experts"):
            tiny_config()  # a training argument, not a TransformerConfig field
        ms.args.num_experts = 8
        with pytest.raises(AssertionError, match="moe-grouped-gemm"):
            tiny_config()
        ms.args.moe_permutation_async_comm = True
        assert tiny_config(moe_grouped_gemm=True).moe_tp_extend_ep is True
