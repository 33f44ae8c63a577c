"""The attach-time proof that rr's router hooks take on the user's own model.

Before a controller takes a model's routers, each router's MoE block runs twice on a few
synthetic tokens under a private controller: once natively, to learn what the router picks,
then replaying a route armed to differ from that pick in every row. The ids the block's experts
receive must be the armed ones; where they are not (a router whose top-k bypasses rr's hook, a
block that no longer calls its router, a kernel that replaced the block) attach raises
:class:`RouterHookError` naming the decoder layer, instead of ``end_step()`` raising after a
training step, or a replay going silently native on a release rr was never tested on.

The probe leaves nothing behind: the private controller is detached, the global RNG states are
restored (a router with jitter noise draws from them), no gradient is recorded, and the model's
hooks are removed. It runs on every release, tested or not: one tiny forward per block.

Shapes: T probe tokens, E experts, K top-k, L routed layers, H hidden size.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayMode, RRError, controller_of
from rr_transformers._errors import RouterHookError

#: Tokens per probe forward: enough that a native choice matching the armed one by chance is
#: impossible (every armed row differs from the native row of the same token).
PROBE_TOKENS = 2


def prove_hooks(
    controller: ReplayController, model: nn.Module, pairs: Sequence[tuple[int, nn.Module]]
) -> None:
    """Prove that every router of ``pairs`` (global layer, router) replays an armed route, or
    raise :class:`RouterHookError` naming the layer. Routers another controller owns are left
    to ``controller.attach``, which refuses them by layer."""
    owners = {controller_of(router) for _, router in pairs} - {None}
    if not pairs or owners - {controller}:
        return
    if owners:  # a re-attach: controller.attach would release the old routers first anyway
        controller.detach()
    layers = model.get_decoder().layers  # type: ignore[operator]
    blocks = [
        (layer, router, _block_of(layers[layer - 1], router, layer)) for layer, router in pairs
    ]
    probe = ReplayController(
        num_experts=controller.num_experts, top_k=controller.top_k, measure_agreement=False
    )
    probe.attach(model, walk=lambda _model: list(pairs))
    try:
        with (
            _quiet(model, [layers[layer - 1] for layer, _ in pairs]),
            _foreign_hooks_set_aside([block for _, _, block in blocks]),
        ):
            hidden = _probe_input(model, pairs[0][1])
            native = [_selected(layer, block, hidden) for layer, _, block in blocks]
            armed_LTK = torch.stack([_other_route(ids_TK, probe.num_experts) for ids_TK in native])
            probe.set_mode(ReplayMode.REPLAY)
            probe.arm(0, armed_LTK.transpose(0, 1), layer_numbers=[layer for layer, _ in pairs])
            with probe.microbatch(0):
                for (layer, router, block), armed_TK in zip(blocks, armed_LTK, strict=True):
                    _check(layer, router, armed_TK, _selected(layer, block, hidden))
    finally:
        probe.detach()


def _block_of(decoder_layer: nn.Module, router: nn.Module, layer: int) -> nn.Module:
    """The MoE block that calls ``router`` and holds the experts it routes to."""
    for module in decoder_layer.modules():
        experts = getattr(module, "experts", None)
        if isinstance(experts, nn.Module) and any(c is router for c in module.children()):
            return module
    raise RouterHookError(
        f"decoder layer {layer - 1} (global layer {layer}): no module holds both its "
        f"{type(router).__name__} and an `experts` module, so rr cannot prove its hook"
    )


@contextlib.contextmanager
def _quiet(model: nn.Module, decoder_layers: Sequence[nn.Module]) -> Iterator[None]:
    """No gradient, the global RNG states restored, FSDP2-sharded layers gathered."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.random.fork_rng(devices=devices))
        for decoder_layer in decoder_layers:
            unshard = getattr(decoder_layer, "unshard", None)
            reshard = getattr(decoder_layer, "reshard", None)
            if callable(unshard) and callable(reshard):
                unshard()  # an FSDP2 module: gather this layer's weights for the probe
                stack.callback(reshard)
        yield


@contextlib.contextmanager
def _foreign_hooks_set_aside(blocks: Sequence[nn.Module]) -> Iterator[None]:
    """The probed blocks' own forward hooks emptied for the probe and put back after: a user's
    hook (expert-load statistics, a tracer) must not see the probe's forwards. rr hooks no
    module of a block, so its replay is what the probe sees."""
    saved = [
        (module, module._forward_pre_hooks, module._forward_hooks)
        for block in blocks
        for module in block.modules()
    ]
    for module, _, _ in saved:
        module._forward_pre_hooks = OrderedDict()
        module._forward_hooks = OrderedDict()
    try:
        yield
    finally:
        for module, pre_hooks, hooks in saved:
            module._forward_pre_hooks = pre_hooks
            module._forward_hooks = hooks


def _probe_input(model: nn.Module, router: nn.Module) -> torch.Tensor:
    """[1, T, H] hidden states from a private generator (the global RNG is not drawn from)."""
    config: Any = model.config
    get_text = getattr(config, "get_text_config", None)
    hidden_size = int((get_text() if callable(get_text) else config).hidden_size)
    weight = next(router.parameters())
    generator = torch.Generator().manual_seed(0)
    hidden_TH = torch.randn(PROBE_TOKENS, hidden_size, generator=generator)
    return hidden_TH.to(device=weight.device, dtype=weight.dtype).unsqueeze(0)


def _selected(layer: int, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    """The [T, K] expert ids ``block``'s experts received in one forward (None if never)."""
    seen: list[torch.Tensor] = []

    def read(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("top_k_index", kwargs.get("router_indices"))
        found = args[1] if ids is None and len(args) > 1 else ids
        if isinstance(found, torch.Tensor):
            seen.append(found)

    handle = block.experts.register_forward_pre_hook(read, with_kwargs=True)  # type: ignore[union-attr]
    try:
        block(hidden)
    except RRError as error:
        raise RouterHookError(
            f"decoder layer {layer - 1} (global layer {layer}): rr's router hook failed on "
            f"attach's probe forward: {error}"
        ) from error
    finally:
        handle.remove()
    return seen[-1].reshape(PROBE_TOKENS, -1).long().cpu() if seen else None


def _other_route(native_TK: torch.Tensor | None, num_experts: int) -> torch.Tensor:
    """Per row, K distinct ids that differ from the native row (the lowest ids outside it, and
    as many of the native ones as E leaves no room for)."""
    if native_TK is None:  # the experts never ran: any route, the check names the layer
        native_TK = torch.zeros(PROBE_TOKENS, 1, dtype=torch.long)
    top_k = native_TK.shape[1]
    rows = []
    for row in native_TK.tolist():
        outside = [e for e in range(num_experts) if e not in row]
        rows.append((outside + row)[:top_k] if outside else row)
    return torch.tensor(rows, dtype=torch.long)


def _check(
    layer: int, router: nn.Module, armed_TK: torch.Tensor, received_TK: torch.Tensor | None
) -> None:
    if received_TK is None:
        raise RouterHookError(
            f"decoder layer {layer - 1} (global layer {layer}): its experts never ran in "
            f"attach's probe forward, so its {type(router).__name__} cannot be replayed"
        )
    same = torch.equal(armed_TK.sort(-1).values, received_TK.sort(-1).values)
    if not same:
        raise RouterHookError(
            f"decoder layer {layer - 1} (global layer {layer}): attach armed experts "
            f"{armed_TK.tolist()} on its {type(router).__name__} and its experts received "
            f"{received_TK.tolist()}: the router selected without rr's hook (its top-k is not "
            "the family's torch.topk call, or another patch or kernel replaced it), so replay "
            "would not take; see `rr explain B3`"
        )
