"""verl 0.9.1's router-replay functions against rr's drop-in (``rr_megatron_compat.verl``), side
by side in one process on the same inputs; figures are medians, ratios are rr / verl.

    python packages/rr-megatron-compat/benchmarks/bench_verl.py [--json] [--rounds N]

Needs verl 0.9.1 importable (``pip install verl==0.9.1 --no-deps`` plus its import-time needs)
next to megatron-core 0.16+. Three workloads, each timed with thread CPU time and wall time in
alternating rounds (verl, rr, verl, rr, ...; the first round of each warms up):

1. ``bookkeeping``: what verl's engine (``MegatronEngine.forward_step``) does around one R3
   micro-batch: ``is_replay_backward_action`` -> ``set_model_router_replay_action(REPLAY_FORWARD)``
   when true, ``is_replay_forward_action``, ``set_router_replay_data`` (jagged int16 routes, the R3
   replay mask, ``model=``), then the model call up to the first line of its forward (so every
   forward pre-hook runs: rr arms and validates the staged targets there), and from the last
   line of its forward through the return of the call (forward hooks: rr tracks the output),
   ``is_replay_forward_action`` -> ``set_model_router_replay_action(REPLAY_BACKWARD)``. Two
   micro-batches a round (the second takes the backward -> forward switch); the forward in
   between runs every decoder router on fixed hidden states (so the staged targets are really
   consumed) and is not timed. ``r3_prep`` times ``align_r3_router_replay_data`` +
   ``build_r3_replay_mask`` of one micro-batch, ``end_of_step`` the engine's
   ``clear_global_indices(); clear_global_router_replay_action()``.
2. ``merge``: ``merge_router_topk_indices`` (jagged ``input_ids``, ``model=``) after a RECORD
   forward (routers only, not timed) in which each side's routers recorded the same routes, at
   ``layers`` / 4, / 2 and x1 layers; the merged routes are checked equal.
3. ``step``: a Megatron training step (forward, backward with full activation recompute,
   several micro-batches through Megatron's schedule) with no replay, with verl's replay, with
   rr's drop-in and with rr's own API (``ReplayController`` + ``rr_megatron_compat.attach``), all
   replaying the same random (non-native) R3 targets; the replayed losses are checked equal
   to each other and different from the unreplayed ones.

Both stacks coexist in one process: verl's ``apply_router_replay_patch`` runs once; its patched
``TopKRouter.__init__`` is put back on the class only while verl's models are built, and its
patched ``TopKRouter.routing`` and alltoall ``preprocess`` are bound on the instances of verl's
models, so the classes keep Megatron's code (under rr's hooks) for rr's models.

Megatron's local (non Transformer Engine) layer spec builds ``SequentialMLP`` experts on CPU:
``moe_grouped_gemm`` stays False. With ``--expert-tree grouped`` (default) each layer's experts
show the module tree of a grouped GEMM (one experts module with ``linear_fc1`` / ``linear_fc2``
children, as ``TEGroupedMLP``) and compute with the ``SequentialMLP`` they hide: both stacks
walk the model's modules, and 128 sequential experts make the decoder's tree about 23 times
larger (some 19 000 modules instead of 819 at 48 layers). ``--expert-tree sequential`` keeps
Megatron's tree as built.

Every torch call goes through the CPU harness (``rr_fakes.megatron.megatron_cpu``) on both
sides alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import rr_megatron_compat as rmc
import rr_megatron_compat.verl as rv
from rr_core import ReplayController, ReplayMode
from rr_fakes.megatron import TinyGPTConfig, build_gpt, model_parallel

RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}


# -- timing ------------------------------------------------------------------------------------


@dataclass
class Span:
    """Thread CPU time and wall time, nanoseconds."""

    cpu: int = 0
    wall: int = 0

    def __iadd__(self, other: Span) -> Span:
        self.cpu += other.cpu
        self.wall += other.wall
        return self


def now() -> Span:
    return Span(time.thread_time_ns(), time.perf_counter_ns())


def since(start: Span) -> Span:
    end = now()
    return Span(end.cpu - start.cpu, end.wall - start.wall)


class Samples:
    """Per-round spans of each side of one figure."""

    def __init__(self) -> None:
        self.spans: dict[str, list[Span]] = {}

    def add(self, side: str, span: Span) -> None:
        self.spans.setdefault(side, []).append(span)

    def median(self, side: str, what: str) -> float:
        return statistics.median(getattr(s, what) for s in self.spans[side]) / 1e6  # ms

    def report(self, sides: Sequence[str], base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for what in ("cpu", "wall"):
            for side in sides:
                out[f"{side}_{what}_ms"] = round(self.median(side, what), 4)
            for side in sides:
                if side != base:
                    out[f"{side}_over_{base}_{what}"] = round(
                        self.median(side, what) / self.median(base, what), 3
                    )
        return out


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


# -- workload 1: per-micro-batch bookkeeping ---------------------------------------------------


def bookkeeping(
    api: Any, model: nn.Module, tc: Any, routes: Any, mask: Any, marks: Marks, hidden: torch.Tensor
) -> Span:
    """The engine's bookkeeping around one replayed micro-batch (the forward itself excluded)."""
    act = api.RouterReplayAction
    helper = api.RouterReplayHelper
    start = now()
    if helper.is_replay_backward_action(tc, 0, model=model):
        api.set_model_router_replay_action(model, act.REPLAY_FORWARD)
    if helper.is_replay_forward_action(tc, 0, model=model):
        api.set_router_replay_data(routes, None, tc, 0, replay_mask=mask, model=model)
    marks.clear()
    model(hidden)
    forward_start, forward_end = marks
    post = now()
    if helper.is_replay_forward_action(tc, 0, model=model):
        api.set_model_router_replay_action(model, act.REPLAY_BACKWARD)
    total = Span(forward_start.cpu - start.cpu, forward_start.wall - start.wall)
    total += since(post)
    total += Span(post.cpu - forward_end.cpu, post.wall - forward_end.wall)
    return total


def run_bookkeeping(
    sides: Mapping[str, Any], models: Mapping[str, nn.Module], args: argparse.Namespace
) -> dict[str, Any]:
    lengths = lengths_of(args.tokens, args.sequences)
    input_ids = token_ids(lengths, 64, seed=1)
    response = torch.ones(len(lengths), 16, dtype=torch.int64)
    micro = [
        rollout_routes(lengths, args.layers, args.experts, args.topk, seed=10 + i) for i in (0, 1)
    ]
    hidden = torch.randn(args.tokens, 1, args.hidden, generator=torch.Generator().manual_seed(2))
    marks: dict[str, Marks] = {}
    for side, model in models.items():
        marks[side] = []
        routers_forward(model, hidden, marks[side])
    book, prep, end = Samples(), Samples(), Samples()
    aligned: dict[str, tuple[Any, Any]] = {}
    for i in range(args.rounds + 1):
        for side, api in sides.items():
            model, tc = models[side], models[side].config
            start = now()
            routes = api.align_r3_router_replay_data(micro[0], input_ids)
            mask = api.build_r3_replay_mask(input_ids, response)
            span = since(start)
            if i:
                prep.add(side, span)
            aligned[side] = routes, mask
            api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.REPLAY_FORWARD)
            for mb in (0, 1):
                routes = (
                    aligned[side][0]
                    if mb == 0
                    else api.align_r3_router_replay_data(micro[1], input_ids)
                )
                span = bookkeeping(api, model, tc, routes, mask, marks[side], hidden)
                if i:
                    book.add(side, span)
            start = now()
            api.RouterReplay.clear_global_indices()
            api.RouterReplay.clear_global_router_replay_action()
            span = since(start)
            if i:
                end.add(side, span)
    check_aligned(aligned)
    names = list(sides)
    return {
        "bookkeeping_per_microbatch": book.report(names, "verl"),
        "r3_prep_per_microbatch": prep.report(names, "verl"),
        "end_of_step": end.report(names, "verl"),
    }


def check_aligned(aligned: Mapping[str, tuple[Any, Any]]) -> None:
    (routes_a, mask_a), (routes_b, mask_b) = aligned.values()
    if not (
        torch.equal(routes_a.values(), routes_b.values())
        and torch.equal(mask_a.values(), mask_b.values())
    ):
        raise AssertionError("verl and rr aligned the R3 routes or built the mask differently")


# -- workload 2: R2 record merge ---------------------------------------------------------------


def run_merge(
    sides: Mapping[str, Any],
    models: Mapping[int, Mapping[str, nn.Module]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    lengths = lengths_of(args.tokens, args.sequences)
    input_ids = token_ids(lengths, 64, seed=3)
    hidden = torch.randn(args.tokens, 1, args.hidden, generator=torch.Generator().manual_seed(4))
    out: dict[str, Any] = {}
    for layers, pair in models.items():
        marks: Marks = []
        for model in pair.values():
            routers_forward(model, hidden, marks)
        samples = Samples()
        merged: dict[str, torch.Tensor] = {}
        for i in range(args.rounds + 1):
            for side, api in sides.items():
                model, tc = pair[side], pair[side].config
                helper = api.RouterReplayHelper
                # compute_log_prob as the engine runs it: queries, forward, merge, query
                api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.RECORD)
                helper.is_replay_backward_action(tc, 0, model=model)
                helper.is_replay_forward_action(tc, 0, model=model)
                with torch.no_grad():
                    model(hidden)
                result: list[torch.Tensor] = []
                start = now()
                api.merge_router_topk_indices(None, input_ids, result, tc, 0, model=model)
                span = since(start)
                helper.is_replay_forward_action(tc, 0, model=model)
                api.RouterReplay.clear_global_indices()
                api.RouterReplay.clear_global_router_replay_action()
                if i:
                    samples.add(side, span)
                merged[side] = result[0]
        a, b = (m.values().sort(dim=-1).values for m in merged.values())
        if a.shape != (args.tokens, layers, args.topk) or not torch.equal(a, b):
            raise AssertionError(f"{layers} layers: verl and rr merged different routes")
        out[f"layers_{layers}"] = samples.report(list(sides), "verl")
    first, last = min(models), max(models)
    for side in sides:
        for what in ("cpu", "wall"):
            key = f"{side}_{what}_ms"
            ratio = out[f"layers_{last}"][key] / out[f"layers_{first}"][key]
            out[f"{side}_{what}_growth_{first}_to_{last}_layers"] = round(ratio, 2)
    return out


# -- workload 3: training step -----------------------------------------------------------------


def step(
    model: nn.Module,
    batches: Sequence[Mapping[str, torch.Tensor]],
    before: Callable[[int], None],
    after: Callable[[int, torch.Tensor], None],
) -> list[float]:
    """Forward and backward of ``batches`` through Megatron's schedule; ``before(mb)`` and
    ``after(mb, output)`` run around each micro-batch's forward."""
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    counter = iter(range(len(batches)))

    def loss_fn(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = output.float().mean()
        return loss, {"lm loss": loss.detach()}

    def forward_step(data: Iterator[Mapping[str, torch.Tensor]], chunk: nn.Module) -> Any:
        batch, mb = next(data), next(counter)
        before(mb)
        output = chunk(
            batch["input_ids"], batch["position_ids"], attention_mask=None, labels=batch["labels"]
        )
        after(mb, output)
        return output, loss_fn

    losses = schedules.get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=model,
        num_microbatches=len(batches),
        seq_length=batches[0]["input_ids"].shape[1],
        micro_batch_size=1,
        forward_only=False,
    )
    return [float(item["lm loss"]) for item in losses]


def run_step(verl: Verl, args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(
        args.step_layers, args.experts, args.topk, args.step_hidden, args.step_tokens, True
    )
    models = {
        "off": build(shape, None, args.expert_tree),
        "verl": build(shape, verl, args.expert_tree),
        "rr_dropin": build(shape, None, args.expert_tree),
        "rr_api": build(shape, None, args.expert_tree),
    }
    for model in models.values():  # one set of weights: every side routes the same tokens
        model.load_state_dict(models["off"].state_dict())
    lengths = lengths_of(args.step_tokens, 2)
    g = torch.Generator().manual_seed(5)
    batches, ids = [], []
    for _ in range(args.step_microbatches):
        tokens = torch.randint(0, 64, (1, args.step_tokens + 1), generator=g)
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        batches.append(
            {"input_ids": tokens[:, :-1], "position_ids": positions, "labels": tokens[:, 1:]}
        )
        ids.append(jagged(list(tokens[0, :-1].split(lengths))))
    response = torch.ones(len(lengths), 16, dtype=torch.int64)
    tc = {side: model.config for side, model in models.items()}
    routes: list[Any] = []  # engine format, jagged int16 [B, j, L, K]
    packed: list[tuple[torch.Tensor, torch.Tensor]] = []  # rr's API: [T, L, K] rows, [T] mask
    controller = ReplayController(num_experts=shape.experts, top_k=shape.topk)
    rmc.attach(controller, models["rr_api"])
    scopes: list[Any] = []

    def use(engine_routes: list[Any]) -> None:
        routes[:] = engine_routes
        packed.clear()
        for mb, r in enumerate(routes):
            aligned = rv.align_r3_router_replay_data(r, ids[mb])
            mask = rv.build_r3_replay_mask(ids[mb], response)
            packed.append((aligned.values().to(torch.int64), mask.values()))

    def engine(api: Any, side: str) -> tuple[Callable[[int], None], Callable[[int, Any], None]]:
        model, config, act = models[side], tc[side], api.RouterReplayAction
        helper = api.RouterReplayHelper

        def before(mb: int) -> None:
            if helper.is_replay_backward_action(config, 0, model=model):
                api.set_model_router_replay_action(model, act.REPLAY_FORWARD)
            if helper.is_replay_forward_action(config, 0, model=model):
                aligned = api.align_r3_router_replay_data(routes[mb], ids[mb])
                mask = api.build_r3_replay_mask(ids[mb], response)
                api.set_router_replay_data(aligned, None, config, 0, replay_mask=mask, model=model)

        def after(mb: int, output: Any) -> None:
            if helper.is_replay_forward_action(config, 0, model=model):
                api.set_model_router_replay_action(model, act.REPLAY_BACKWARD)

        return before, after

    def api_before(mb: int) -> None:
        scopes.append(controller.microbatch(mb))
        scopes.append(scopes[-1].__enter__())

    def api_after(mb: int, output: Any) -> None:
        handle, scope = scopes.pop(), scopes.pop()
        handle.track(output)
        scope.__exit__(None, None, None)

    def run_off() -> list[float]:
        return step(models["off"], batches, lambda mb: None, lambda mb, out: None)

    def run_engine(api: Any, side: str) -> Callable[[], list[float]]:
        before, after = engine(api, side)

        def go() -> list[float]:
            api.RouterReplay.set_global_router_replay_action(api.RouterReplayAction.REPLAY_FORWARD)
            losses = step(models[side], batches, before, after)
            api.RouterReplay.clear_global_indices()
            api.RouterReplay.clear_global_router_replay_action()
            return losses

        return go

    def run_api() -> list[float]:
        controller.set_mode(ReplayMode.REPLAY)
        for mb, (rows, mask) in enumerate(packed):
            controller.arm(mb, rows, layer_numbers=controller.layer_numbers, replay_mask_T=mask)
        losses = step(models["rr_api"], batches, api_before, api_after)
        controller.end_step()
        return losses

    # native routes (recorded by rr's API, untimed) as the rollout would return them: a
    # replayed step then routes exactly as the unreplayed one, so only replay's own work differs
    controller.set_mode(ReplayMode.RECORD)
    step(models["rr_api"], batches, api_before, api_after)
    native = []
    for mb in range(len(batches)):
        rows = controller.recorded(mb).to(torch.int16)
        native.append(jagged([seq[:-1] for seq in rows.split(lengths)]))
    controller.end_step()
    use(native)

    runs = {
        "off": run_off,
        "verl": run_engine(verl, "verl"),
        "rr_dropin": run_engine(rv, "rr_dropin"),
        "rr_api": run_api,
    }
    samples, losses = Samples(), {}
    for i in range(args.step_rounds + 1):
        for side, fn in runs.items():
            gc.collect()
            start = now()
            losses[side] = fn()
            span = since(start)
            if i:
                samples.add(side, span)
    check_losses(losses, same_as_off=True)
    # replay takes effect on each side: random (non-native) targets, untimed
    use(
        [
            rollout_routes(lengths, shape.layers, shape.experts, shape.topk, 20 + mb)
            for mb in range(len(batches))
        ]
    )
    check_losses({side: fn() for side, fn in runs.items()}, same_as_off=False)
    controller.detach()
    return samples.report(list(runs), "off")


def check_losses(losses: Mapping[str, list[float]], *, same_as_off: bool) -> None:
    def close(a: list[float], b: list[float]) -> bool:
        return all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True))

    replayed = [losses[s] for s in ("verl", "rr_dropin", "rr_api")]
    if not all(close(replayed[0], other) for other in replayed[1:]):
        raise AssertionError(f"replayed losses differ: {dict(losses)}")
    if close(replayed[0], losses["off"]) != same_as_off:
        what = "differ from" if same_as_off else "equal"
        raise AssertionError(f"replayed losses {what} the unreplayed ones: {dict(losses)}")


# -- driver ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr), model_parallel():
        verl = Verl()
        rv.apply_router_replay_patch()
        try:
            sides = {"verl": verl, "rr": rv}
            shape = Shape(args.layers, args.experts, args.topk, args.hidden, args.tokens)
            big = {
                "verl": build(shape, verl, args.expert_tree),
                "rr": build(shape, None, args.expert_tree),
            }
            modules = sum(1 for _ in big["rr"].decoder.modules())
            w1 = run_bookkeeping(sides, big, args)
            sizes = sorted({max(1, args.layers // 4), max(1, args.layers // 2)} - {args.layers})
            pairs: dict[int, dict[str, nn.Module]] = {}
            for layers in sizes:
                small = Shape(layers, args.experts, args.topk, args.hidden, args.tokens)
                pairs[layers] = {
                    "verl": build(small, verl, args.expert_tree),
                    "rr": build(small, None, args.expert_tree),
                }
            pairs[args.layers] = big
            w2 = run_merge(sides, pairs, args)
            # the step starts from fresh registries, as an engine with one model has
            del big, pairs
            rv.remove_router_replay_patch()
            verl.RouterReplay.router_instances.clear()
            gc.collect()
            rv.apply_router_replay_patch()
            w3 = run_step(verl, args) if args.step_rounds else {}
        finally:
            rv.remove_router_replay_patch()
    return {
        "verl": importlib.import_module("verl").__version__,
        "megatron_core": str(rmc.megatron_line().version),
        "torch_threads": args.threads,
        "rounds": args.rounds,
        "layers": args.layers,
        "tokens": args.tokens,
        "sequences": args.sequences,
        "experts": args.experts,
        "topk": args.topk,
        "expert_tree": args.expert_tree,
        "decoder_modules": modules,
        "moe_grouped_gemm": False,
        "bookkeeping": w1,
        "merge": w2,
        "step": {
            "layers": args.step_layers,
            "tokens_per_microbatch": args.step_tokens,
            "microbatches": args.step_microbatches,
            "rounds": args.step_rounds,
            "recompute": "full",
            **w3,
        },
        "runtime_s": round(time.perf_counter() - began, 1),
    }


def table(result: Mapping[str, Any]) -> str:
    lines = [
        f"verl {result['verl']} vs rr, megatron-core {result['megatron_core']}, "
        f"{result['layers']} layers x {result['tokens']} tokens, top-{result['topk']} of "
        f"{result['experts']}, {result['expert_tree']} expert tree, "
        f"{result['torch_threads']} thread(s); medians in ms, ratios rr / verl",
        f"{'figure':34} {'verl cpu':>9} {'rr cpu':>9} {'cpu x':>6} {'wall x':>6}",
    ]

    def row(name: str, figure: Mapping[str, Any], a: str = "verl", b: str = "rr") -> None:
        lines.append(
            f"{name:34} {figure[f'{a}_cpu_ms']:9.3f} {figure[f'{b}_cpu_ms']:9.3f} "
            f"{figure[f'{b}_over_{a}_cpu']:6.2f} {figure[f'{b}_over_{a}_wall']:6.2f}"
        )

    w1 = result["bookkeeping"]
    row("bookkeeping / micro-batch", w1["bookkeeping_per_microbatch"])
    row("R3 align + mask / micro-batch", w1["r3_prep_per_microbatch"])
    row("end of step (clear)", w1["end_of_step"])
    for key, figure in result["merge"].items():
        if key.startswith("layers_"):
            row(f"R2 merge, {key.split('_')[1]} layers", figure)
    step = result["step"]
    if "off_cpu_ms" in step:
        lines.append(
            f"training step ({step['layers']} layers, {step['microbatches']} x "
            f"{step['tokens_per_microbatch']} tokens, recompute): "
            f"off {step['off_cpu_ms']:.1f} ms cpu"
        )
        for side in ("verl", "rr_dropin", "rr_api"):
            lines.append(
                f"  {side:10} / off   cpu {step[f'{side}_over_off_cpu']:.3f}   "
                f"wall {step[f'{side}_over_off_wall']:.3f}"
            )
    lines.append(f"runtime {result['runtime_s']} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--sequences", type=int, default=4, help="sequences per micro-batch")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--expert-tree", choices=("grouped", "sequential"), default="grouped")
    parser.add_argument("--step-rounds", type=int, default=4, help="0 skips the step workload")
    parser.add_argument("--step-layers", type=int, default=4)
    parser.add_argument("--step-tokens", type=int, default=256)
    parser.add_argument("--step-microbatches", type=int, default=4)
    parser.add_argument("--step-hidden", type=int, default=16)
    args = parser.parse_args()
    if importlib.util.find_spec("verl") is None:
        raise SystemExit("bench_verl needs verl 0.9.1: pip install verl==0.9.1 --no-deps (+ deps)")
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
