"""bench_verl's two stacks and what they run on: verl's router-replay functions bound to verl's
models only, the Megatron models of both sides and the engine-format inputs."""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from verl_measure import Span, now

from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt

RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}


# -- verl's functions, bound to verl's models only ---------------------------------------------


class Verl:
    """verl 0.9.1's router-replay modules, patched once, with the class patches confined to
    verl's models (see the module docstring)."""

    def __init__(self) -> None:
        router_mod = importlib.import_module("megatron.core.transformer.moe.router")
        dispatcher_mod = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
        config_mod = importlib.import_module("megatron.core.transformer.transformer_config")
        self.TopKRouter = router_mod.TopKRouter
        self.Dispatcher = dispatcher_mod.MoEAlltoAllTokenDispatcher
        config_cls = config_mod.TransformerConfig
        saved = [
            (self.TopKRouter, "__init__"),
            (self.TopKRouter, "routing"),
            (self.Dispatcher, "preprocess"),
            (config_cls, "__init__"),
        ]
        originals = [(owner, name, owner.__dict__[name]) for owner, name in saved]
        signature = config_cls.__init__.__dict__.get("__signature__")
        self.patch = importlib.import_module("verl.utils.megatron.router_replay_patch")
        self.utils = importlib.import_module("verl.utils.megatron.router_replay_utils")
        self.patch.apply_router_replay_patch()
        self.init = self.TopKRouter.__dict__["__init__"]
        self.routing = self.TopKRouter.__dict__["routing"]
        self.preprocess = self.Dispatcher.__dict__["preprocess"]
        for owner, name, original in originals:
            setattr(owner, name, original)
        for owner, flag in [
            (self.TopKRouter, "_router_replay_patched"),
            (self.Dispatcher, "_preprocess_patched"),
            (config_cls, "_verl_router_patched"),
        ]:
            if flag in owner.__dict__:
                delattr(owner, flag)
        if signature is None:
            config_cls.__init__.__dict__.pop("__signature__", None)

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        current = self.TopKRouter.__dict__["__init__"]  # Megatron's, under rr's hooks
        self.TopKRouter.__init__ = self.init
        try:
            yield
        finally:
            self.TopKRouter.__init__ = current

    def bind(self, model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, self.TopKRouter):
                module.routing = types.MethodType(self.routing, module)
            if isinstance(module, self.Dispatcher):
                module.preprocess = types.MethodType(self.preprocess, module)

    def __getattr__(self, name: str) -> Any:
        for module in (self.utils, self.patch):
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


# -- models ------------------------------------------------------------------------------------


class GroupedExperts(nn.Module):
    """A grouped-GEMM experts module tree (``linear_fc1`` / ``linear_fc2`` children) computing
    with the ``SequentialMLP`` it holds outside the module tree."""

    def __init__(self, sequential: nn.Module) -> None:
        super().__init__()
        self.linear_fc1 = nn.Identity()
        self.linear_fc2 = nn.Identity()
        self.__dict__["sequential"] = sequential

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.sequential(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["sequential"], name)


@dataclass(frozen=True)
class Shape:
    layers: int
    experts: int
    topk: int
    hidden: int
    seq: int
    recompute: bool = False


def build(shape: Shape, verl: Verl | None, tree: str, seed: int = 0) -> nn.Module:
    extra: dict[str, Any] = {"moe_enable_routing_replay": True}
    if shape.recompute:
        extra.update(RECOMPUTE)
    config = TinyGPTConfig(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=1,
        ffn_hidden_size=shape.hidden,
        num_experts=shape.experts,
        top_k=shape.topk,
        max_sequence_length=shape.seq,
        extra=extra,
    )
    torch.manual_seed(seed)
    with verl.building() if verl is not None else contextlib.nullcontext():
        model = build_gpt(config)
    if verl is not None:
        verl.bind(model)
    if tree == "grouped":
        for layer in model.decoder.layers:
            experts = getattr(layer.mlp, "experts", None)
            if experts is not None:
                layer.mlp.experts = GroupedExperts(experts)
    return model


def decoder_routers(model: nn.Module) -> list[nn.Module]:
    router_cls = importlib.import_module("megatron.core.transformer.moe.router").TopKRouter
    return [m for m in model.decoder.modules() if isinstance(m, router_cls)]


Marks = list[Span]


def routers_forward(model: nn.Module, hidden_SBH: torch.Tensor, marks: Marks) -> None:
    """Replace ``model``'s forward by one that runs each decoder router on ``hidden_SBH`` and
    stamps the time at its first and last line into ``marks``."""
    routers = decoder_routers(model)

    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        marks.append(now())
        total = hidden_SBH.new_zeros(())
        for router in routers:
            probs, _ = router(hidden_SBH)
            total = total + probs.sum()
        marks.append(now())
        return total

    model.forward = forward  # type: ignore[method-assign]


# -- inputs ------------------------------------------------------------------------------------


def lengths_of(tokens: int, sequences: int) -> list[int]:
    """``sequences`` lengths summing to ``tokens``, uneven."""
    base = tokens // sequences
    out = [base + (i - sequences // 2) * (base // 8) for i in range(sequences)]
    out[-1] += tokens - sum(out)
    return out


def jagged(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(list(parts), layout=torch.jagged)


def rollout_routes(lengths: Sequence[int], layers: int, experts: int, topk: int, seed: int) -> Any:
    """Engine routes, jagged int16 ``[B, j, L, K]`` with ``j = len - 1`` (no route for the last
    sampled token), distinct ids per row."""
    g = torch.Generator().manual_seed(seed)
    stride = experts // topk
    parts = []
    for n in lengths:
        base = torch.randint(0, experts, (n - 1, layers, 1), generator=g)
        parts.append(((base + torch.arange(topk) * stride) % experts).to(torch.int16))
    return jagged(parts)


def token_ids(lengths: Sequence[int], vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return jagged([torch.randint(0, vocab, (n,), generator=g) for n in lengths])
