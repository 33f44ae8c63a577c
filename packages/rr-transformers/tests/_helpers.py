"""What the tests read off a real transformers model: the expert ids and gate weights each
MoE block's experts actually received, and the reference router arithmetic per family."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rr_core import ReplayController, ReplayMode
from rr_fakes.shims.hf_models import NUM_EXPERTS, perturb_routers
from rr_transformers import KNOWN_FAMILIES, Family, installed_transformers_version
from rr_transformers._families import text_config

VERSION = installed_transformers_version()
assert VERSION is not None
FAMILIES = sorted(name for name, f in KNOWN_FAMILIES.items() if f.available(VERSION))


@contextmanager
def expert_inputs(model: nn.Module) -> Iterator[dict[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Per decoder layer (1-based), every (ids_TK, weights_TK) its experts module received."""
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    with contextlib.ExitStack() as hooks:
        for index, layer in enumerate(model.get_decoder().layers):
            for module in layer.modules():
                experts = getattr(module, "experts", None)
                if isinstance(experts, nn.Module):

                    def hook(_m, args, kwargs, layer=index + 1):
                        ids, weights = [*args[1:3], None, None][:2]
                        ids = kwargs.get("top_k_index", kwargs.get("router_indices", ids))
                        weights = kwargs.get(
                            "top_k_weights", kwargs.get("routing_weights", weights)
                        )
                        seen.setdefault(layer, []).append((ids.detach(), weights))

                    hooks.enter_context(experts.register_forward_pre_hook(hook, with_kwargs=True))
        yield seen


@contextmanager
def router_inputs(model: nn.Module, family: Family) -> Iterator[dict[int, torch.Tensor]]:
    """Per decoder layer, the hidden states its router received (last call)."""
    seen: dict[int, torch.Tensor] = {}
    with contextlib.ExitStack() as hooks:
        cls = family.router_class()
        for index, layer in enumerate(model.get_decoder().layers):
            for module in layer.modules():
                if type(module) is cls:

                    def hook(_m, args, layer=index + 1):
                        seen[layer] = args[0].detach()

                    hooks.enter_context(module.register_forward_pre_hook(hook))
        yield seen


def routers(model: nn.Module, family: Family) -> dict[int, nn.Module]:
    cls = family.router_class()
    out = {}
    for index, layer in enumerate(model.get_decoder().layers):
        for module in layer.modules():
            if type(module) is cls:
                out[index + 1] = module
    return out


def reference_weights(
    family: Family, model: nn.Module, router: nn.Module, hidden: torch.Tensor, ids_TK: torch.Tensor
) -> torch.Tensor:
    """The gate weights the family's documented semantics give for experts ``ids_TK``, from the
    router's own weights: written here from the semantics in rr_transformers._supported, so a
    family whose code does something else fails the test."""
    config = text_config(model.config)
    h = hidden.reshape(-1, hidden.shape[-1]).float()
    logits = nn.functional.linear(h, router.weight.float(), getattr(router, "bias", None))
    ids = ids_TK.long()
    if family.score == "topk_softmax":
        return torch.softmax(logits.gather(1, ids), dim=-1)
    scores = torch.softmax(logits, -1) if family.score == "softmax" else torch.sigmoid(logits)
    weights = scores.gather(1, ids)
    if family.normalises(config):
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if family.expert_bias else 0))
    if family.scaling:
        weights = weights * getattr(config, family.scaling)
    return weights


def same_sets(a_TK: torch.Tensor, b_TK: torch.Tensor) -> bool:
    return bool(torch.equal(a_TK.long().sort(-1).values, b_TK.long().sort(-1).values))


@contextmanager
def replaying_moved_routers(
    model: nn.Module, family: Family, controller: ReplayController, recorded_TLK: torch.Tensor
) -> Iterator[tuple[dict[int, list[tuple[torch.Tensor, torch.Tensor]]], dict[int, torch.Tensor]]]:
    """Micro-batch 0 replaying ``recorded_TLK`` after the router weights moved: what each
    layer's experts received and each router's input, by layer."""
    perturb_routers(model)
    controller.set_mode(ReplayMode.REPLAY)
    controller.arm(0, recorded_TLK, layer_numbers=controller.layer_numbers)
    with (
        expert_inputs(model) as seen,
        router_inputs(model, family) as hidden,
        controller.microbatch(0),
    ):
        yield seen, hidden


def check_replayed_weights(
    model: nn.Module,
    family: Family,
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
    hidden: dict[int, torch.Tensor],
    recorded_TLK: torch.Tensor,
    layers: tuple[int, ...],
) -> dict[int, nn.Module]:
    """Each of ``layers`` (the slots of ``recorded_TLK``) had its experts receive the recorded
    sets, with the family's gate weights from the moved router's own scores
    (:func:`reference_weights`); returns the routers by layer."""
    by_router = routers(model, family)
    for slot, layer in enumerate(layers):
        ((ids_TK, weights_TK),) = seen[layer]
        assert same_sets(ids_TK, recorded_TLK[:, slot]), f"layer {layer}"
        expected = reference_weights(family, model, by_router[layer], hidden[layer], ids_TK)
        if weights_TK.shape[-1] == NUM_EXPERTS:  # a [T, E] scatter of the K weights
            weights_TK = weights_TK.gather(1, ids_TK.long())
        torch.testing.assert_close(weights_TK.float(), expected, rtol=1e-5, atol=1e-6)
    return by_router
