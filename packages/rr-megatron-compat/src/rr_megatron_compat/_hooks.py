"""The wrappers :func:`rr_megatron_compat.install` puts around Megatron's router.

Shapes: T tokens, E experts, K top-k.

``TopKRouter.routing`` is wrapped on every line: for a router attached to an rr controller in a
mode other than OFF it opens a :class:`_Call` (which router is routing), runs Megatron's own
routing, and raises if the selection hook never fired (fused routing, sinkhorn, or a 0.16+
config built without ``moe_enable_routing_replay``: never a silent native fall-through). The
selection hook then hands Megatron's selection scores to :func:`rr_core.router_topk`:

- 0.16+: ``RouterReplay.get_replay_topk``, Megatron's native hook point;
- 0.12 - 0.15: the top-k function the router calls is run with group-limited selection forced
  on, so its top-k step goes through ``moe_utils.group_limited_topk``, which the hook replaces
  for that call (the real group setting is applied by :func:`_select`).

Everything around the selection (score function, pre-softmax, expert bias, scaling factor,
capacity, aux / seq-aux / global-aux and z losses) stays Megatron's code on every line, except
the expert-bias token count of a call with a ``padding_mask`` on the lines where Megatron's is
wrong (G1, :mod:`rr_megatron_compat._stats`).
Routers that are not attached, or attached in OFF mode, run Megatron's code untouched.
"""

from __future__ import annotations

import contextvars
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rr_core import ReplayError, ReplayMode, controller_of, router_topk
from rr_megatron_compat import _dispatcher, _stats
from rr_megatron_compat._versions import megatron_line


@dataclass
class _Call:
    """One routing call of an attached router."""

    router: nn.Module
    fired: int = 0
    steer: bool = False  # 0.12 - 0.15: inside the top-k function, steered to group selection
    num_groups: int | None = None
    group_topk: int | None = None
    #: ``(S, mbs)`` where the layer routes a packed batch as ``[S, mbs]`` rows (0.19+)
    sample_minor: tuple[int, int] | None = None


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "rr_megatron_call", default=None
)


def _layer(router: nn.Module) -> int:
    return int(getattr(router, "layer_number", 0) or 0)


def _padding_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The ``padding_mask`` of a ``routing(logits, padding_mask=None)`` call (0.16+; earlier
    lines' routing takes logits only)."""
    if not megatron_line().padding_mask:
        return None
    return kwargs.get("padding_mask", args[1] if len(args) > 1 else None)


def routing_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``TopKRouter.routing``: mark the routing router, check that replay took effect."""
    controller = None if instance is None else controller_of(instance)
    # the mode is read once: it cannot change inside the router's own call
    mode = ReplayMode.OFF if controller is None else controller.mode_of(_layer(instance))
    if mode is ReplayMode.OFF:
        return wrapped(*args, **kwargs)
    call = _Call(instance, sample_minor=SAMPLE_MINOR.get(instance))
    padding_mask = _padding_mask(args, kwargs)
    count = _stats.counts_in_megatrons_place(instance, padding_mask)  # G1
    token = _CALL.set(call)
    try:
        if count:
            with _stats.megatron_update_off(instance):
                probs, routing_map = wrapped(*args, **kwargs)
        else:
            probs, routing_map = wrapped(*args, **kwargs)
    finally:
        _CALL.reset(token)
    if not call.fired:
        raise ReplayError(
            f"layer {_layer(instance)}: the router ran but rr's top-k hook never fired, so "
            "replay / record did not take effect. Causes: moe_router_fusion=True (C2), "
            "sinkhorn load balancing, or on megatron-core 0.16+ a config built without "
            "moe_enable_routing_replay (call rr_megatron_compat.enable_replay(config) before "
            "building the model); see `rr explain C2`"
        )
    _stats.after_routing(instance, routing_map, padding_mask, count=count)
    if mode is ReplayMode.REPLAY:
        _dispatcher.mark_replayed()
    return probs, routing_map


def group_masked_scores(
    scores_TE: torch.Tensor, topk: int, num_groups: int, group_topk: int
) -> torch.Tensor:
    """Megatron's group-limited selection as a mask: scores of experts outside the token's
    ``group_topk`` best groups become -inf (``moe_utils.group_limited_topk`` selects the plain
    top-k of exactly this tensor, on every line 0.12 - 0.19)."""
    num_tokens, num_experts = scores_TE.shape
    group_scores_TG = (
        scores_TE.view(num_tokens, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
    )
    group_idx = torch.topk(group_scores_TG, k=group_topk, dim=-1, sorted=False)[1]
    group_mask_TG = torch.zeros_like(group_scores_TG)
    group_mask_TG.scatter_(1, group_idx, 1)
    score_mask_TE = (
        group_mask_TG.unsqueeze(-1)
        .expand(num_tokens, num_groups, num_experts // num_groups)
        .reshape(num_tokens, -1)
    )
    return scores_TE.masked_fill(~score_mask_TE.bool(), float("-inf"))


def _select(
    call: _Call,
    scores_TE: torch.Tensor,
    topk: int,
    num_groups: int | None,
    group_topk: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k step of an attached router: values and ids as Megatron's own would return.
    Rows of a packed batch are routed sample by sample (the order rr records in) and handed
    back in Megatron's order."""
    call.fired += 1
    packed = call.sample_minor  # rr is armed, and records, in packed order
    if packed is not None:
        S, mbs = packed
        if scores_TE.shape[0] != S * mbs:
            raise ReplayError(
                f"layer {_layer(call.router)}: the router routes {scores_TE.shape[0]} rows, but "
                f"its layer last un-flattened a packed batch into [S={S}, mbs={mbs}] rows "
                "(PackedSeqParams.tokens_per_sample); micro-batches of one step must share "
                "tokens_per_sample and micro-batch size for rr to map their rows"
            )
        scores_TE = scores_TE.view(S, mbs, -1).transpose(0, 1).reshape(S * mbs, -1)
    if group_topk:
        if not num_groups:
            raise ReplayError(
                f"layer {_layer(call.router)}: moe_router_group_topk={group_topk} needs "
                "moe_router_num_groups"
            )
        selection_TE = group_masked_scores(scores_TE, topk, num_groups, group_topk)
        out = router_topk(call.router, selection_TE, topk, values_TE=scores_TE)
    else:
        out = router_topk(call.router, scores_TE, topk)
    if packed is None:
        return out.values_TK, out.ids_TK
    return tuple(  # type: ignore[return-value]
        t.view(mbs, S, -1).transpose(0, 1).reshape(S * mbs, -1) for t in (out.values_TK, out.ids_TK)
    )


#: Each router's last row order, left by :func:`unflatten_wrapper` for the router's next
#: routing: rr's own table, not an attribute on Megatron's module (uninstall clears it).
SAMPLE_MINOR: weakref.WeakKeyDictionary[nn.Module, tuple[int, int] | None] = (
    weakref.WeakKeyDictionary()
)


def unflatten_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """0.19+: ``TransformerLayer._maybe_unflatten_for_moe``. With ``tokens_per_sample`` it turns
    a packed ``[mbs * S, 1, H]`` batch into ``[S, mbs, H]`` for the MoE layer; the layer's router
    keeps the order it routes in until the layer's next forward (a backward recompute of the MoE
    layer routes the same rows)."""
    hidden_states, padding_mask, mbs = wrapped(*args, **kwargs)
    router = getattr(getattr(instance, "mlp", None), "router", None)
    if router is not None:
        order = None if mbs is None else (int(hidden_states.shape[0]), int(hidden_states.shape[1]))
        SAMPLE_MINOR[router] = order
    return hidden_states, padding_mask, mbs


#: ``(type, function)`` of a wrapped callable -> {parameter: (position or None, default)}
_PARAMETERS: dict[tuple[type, Any], dict[str, tuple[int | None, Any]]] = {}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _parameters(wrapped: Callable[..., Any]) -> dict[str, tuple[int | None, Any]]:
    """Where each parameter of ``wrapped`` sits in a call, read from its signature once per
    function (a bound method's entry is its function's: one per class, not per instance).
    Finding a few arguments by name this way costs a dict lookup, where ``Signature.bind``
    cost ~10 us per hooked call."""
    key = (type(wrapped), getattr(wrapped, "__func__", wrapped))
    found = _PARAMETERS.get(key)
    if found is None:
        found = _PARAMETERS[key] = {
            p.name: (i if p.kind in _POSITIONAL else None, p.default)
            for i, p in enumerate(inspect.signature(wrapped).parameters.values())
        }
    return found


def _arguments(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *names: str
) -> list[Any]:
    """The values parameters ``names`` of ``wrapped`` take in the call ``(*args, **kwargs)``
    (None for a parameter ``wrapped`` does not have)."""
    parameters, values = _parameters(wrapped), []
    for name in names:
        position, default = parameters.get(name, (None, None))
        if name in kwargs:
            values.append(kwargs[name])
        elif position is not None and position < len(args):
            values.append(args[position])
        elif default is inspect.Parameter.empty:
            raise TypeError(f"{getattr(wrapped, '__qualname__', wrapped)}() missing {name!r}")
        else:
            values.append(default)
    return values


def _with_arguments(
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    values: dict[str, Any],
) -> tuple[list[Any], dict[str, Any]]:
    """The call ``(*args, **kwargs)`` with the parameters in ``values`` set to those values."""
    new_args, new_kwargs = list(args), dict(kwargs)
    parameters = _parameters(wrapped)
    for name, value in values.items():
        position = parameters[name][0]
        if name not in kwargs and position is not None and position < len(args):
            new_args[position] = value
        else:
            new_kwargs[name] = value
    return new_args, new_kwargs


def topk_function_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """0.12 - 0.15: ``topk_softmax_with_capacity`` / ``topk_routing_with_score_function`` as
    the router calls them. Steers the selection through ``group_limited_topk``."""
    call = _CALL.get()
    if call is None or call.steer:
        return wrapped(*args, **kwargs)
    fused, num_groups, group_topk = _arguments(
        wrapped, args, kwargs, "fused", "num_groups", "group_topk"
    )  # (no ``fused`` before 0.14)
    if fused:
        return wrapped(*args, **kwargs)  # fusion skips the hook; routing_wrapper raises (C2)
    call.num_groups, call.group_topk = num_groups, group_topk
    steered_args, steered_kwargs = _with_arguments(
        wrapped, args, kwargs, {"num_groups": num_groups or 1, "group_topk": group_topk or 1}
    )
    call.steer = True
    try:
        return wrapped(*steered_args, **steered_kwargs)
    finally:
        call.steer = False


def group_select_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """0.12 - 0.15: ``moe_utils.group_limited_topk``, the steered selection step."""
    call = _CALL.get()
    if call is None or not call.steer:
        return wrapped(*args, **kwargs)
    scores, topk = _arguments(wrapped, args, kwargs, "scores", "topk")
    return _select(call, scores, topk, call.num_groups, call.group_topk)


def native_select_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """0.16+: ``RouterReplay.get_replay_topk`` of an attached router goes to rr; every other
    RouterReplay (orphans, models rr does not drive) keeps Megatron's native behaviour."""
    call = _CALL.get()
    if call is None or getattr(call.router, "router_replay", None) is not instance:
        return wrapped(*args, **kwargs)
    action = getattr(instance, "router_replay_action", None)
    if action is not None:
        raise ReplayError(
            f"layer {_layer(call.router)}: Megatron's native RouterReplay action {action} is set "
            "on a router an rr controller drives; use one mechanism (clear the native action "
            "with RouterReplay.clear_global_router_replay_action())"
        )
    scores, topk, num_groups, group_topk = _arguments(
        wrapped, args, kwargs, "scores", "topk", "num_groups", "group_topk"
    )
    return _select(call, scores, topk, num_groups, group_topk)


WRAPPERS: dict[str, Callable[..., Any]] = {
    "routing": routing_wrapper,
    "topk_function": topk_function_wrapper,
    "group_select": group_select_wrapper,
    "native_select": native_select_wrapper,
    "alltoall_preprocess": _dispatcher.alltoall_preprocess_wrapper,
    "unflatten": unflatten_wrapper,
}
