"""Is Megatron's routing replaced? Decided from what the router will actually reach.

For each attribute on the routing path that rr hooks on the installed line (``TopKRouter.routing``,
and on 0.12 - 0.15 the router module's top-k function and ``moe_utils.group_limited_topk``;
``RouterReplay.get_replay_topk`` on 0.16+), the value held now is followed down: through rr's
proxies and ``__wrapped__`` chains, and through MindSpeed's records: a value that is a
``Patch``'s ``final_patch_func`` with ``patch_func`` None is wrappers over ``orig_func`` (a
pass-through: followed to ``orig_func``); one with ``patch_func`` set is a replacement. Routing is
replaced only where a replacement is reached. A registration that nothing on the path reaches
(fix-router on 0.17 / 0.18, whose target Megatron no longer calls; any patch after ``repatch``
dropped it, whose entry stays with ``patch_func=None``) and config flags alone (``--fix-router``
on 0.16, which has no such feature) are not replacements. Nothing here imports Megatron: only
modules already loaded are looked at.

A replacement of ``TopKRouter.routing`` itself is still called through rr's proxy, so it is
refused only where it bypasses or breaks the selection hook. MindSpeed's
``routing_tp_extend_ep(self, logits)`` (``--moe-tp-extend-ep``):

- megatron-core 0.16+: Megatron calls ``routing(logits, padding_mask=...)``, which it does not
  take (TypeError at the first forward); refused, as is any routing replacement without
  ``padding_mask`` there.
- 0.12: with ``moe_router_load_balancing_type`` ``aux_loss`` (Megatron's default) it calls
  Megatron's ``aux_loss_load_balancing``, which calls the router module's top-k, rr's hook:
  accepted. With ``none`` it calls MindSpeed's own import of ``topk_softmax_with_capacity``
  (bypassed), with ``sinkhorn`` Megatron's sinkhorn, and anything else raises ValueError: refused.
- MindSpeed's 0.17 / 0.18 lines cannot import the feature (its MoE package imports a dispatcher
  module those megatron-core releases dropped), so ``import mindspeed.megatron_adaptor`` fails
  with the flag set, before rr is reached.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import wrapt

import rr_megatron_compat as rmc
from rr_core import RRError
from rr_npu._mindspeed import global_args, registry

_OFF_PATH = ("alltoall_preprocess",)
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"  # rr hooks it, but it does not route

#: MindSpeed's routing replacements: target -> (feature, trigger on 0.12, trigger later, fix).
KNOWN: dict[str, tuple[str, str, str, str]] = {
    "megatron.core.transformer.moe.router.TopKRouter.routing": (
        "moe_tp_extend_ep",
        "registered with --moe-tp-extend-ep and --moe-token-dispatcher-type alltoall_seq at "
        "optimization level 2 (it also replaces MoELayer unless --moe-alltoall-overlap-comm)",
        "",
        "drop --moe-tp-extend-ep, or use the alltoall dispatcher (on megatron-core 0.12 keeping "
        "moe_router_load_balancing_type='aux_loss' also works)",
    ),
    "megatron.core.transformer.moe.moe_utils.topk_softmax_with_capacity": (
        "fix_router",
        "registered on MindSpeed's 0.12 line when --fix-router OR --moe-expert-capacity-factor "
        "is set",
        "registered with --fix-router",
        "drop --fix-router and --moe-expert-capacity-factor (dropless routing)",
    ),
}
_TRIGGER_FLAGS = (
    "fix_router",
    "moe_expert_capacity_factor",
    "moe_tp_extend_ep",
    "moe_router_load_balancing_type",
)
ROUTING_TARGET = "megatron.core.transformer.moe.router.TopKRouter.routing"
TP_EXTEND_EP_ROUTING = "routing_tp_extend_ep"
#: what routing_tp_extend_ep does on megatron-core 0.12, by moe_router_load_balancing_type
_TP_EXTEND_EP_012 = {
    "none": "with moe_router_load_balancing_type='none' it calls MindSpeed's own import of "
    "topk_softmax_with_capacity, not the router module's (rr's hook): replay is bypassed",
    "sinkhorn": "with moe_router_load_balancing_type='sinkhorn' it calls Megatron's sinkhorn "
    "selection, which has no top-k step to replay",
}


class RoutingReplacedError(RRError):
    """A MindSpeed feature replaces a function the router reaches, so replay would be bypassed."""


@dataclass(frozen=True)
class Replacement:
    """A MindSpeed replacement the router reaches: the feature, the patched target, the
    attribute on the routing path it is reached through, and the replacement's name."""

    feature: str
    target: str
    reached_through: str
    function: str
    trigger: str
    fix: str
    effect: str = ""

    def describe(self) -> str:
        effect = f"; {self.effect}" if self.effect else ""
        return (
            f"MindSpeed's {self.feature} replaces {self.target} with {self.function}, reached "
            f"by the router through {self.reached_through} ({self.trigger}){effect}; fix: "
            f"{self.fix}"
        )


def _raw(owner: Any, name: str) -> Any:
    for klass in getattr(owner, "__mro__", (owner,)):
        if name in vars(klass):
            return vars(klass)[name]
    return getattr(owner, name, None)


def _path() -> list[tuple[str, Any]]:
    """``(name, value held now)`` of each loaded attribute on the routing path."""
    try:
        specs = rmc.hook_specs(rmc.megatron_line())
    except ImportError:
        return []
    found = []
    for spec in specs:
        module = sys.modules.get(spec.module)
        if module is None and spec.owner is None:
            module = sys.modules.get(MOE_UTILS)  # what the router module will import from
        if spec.role in _OFF_PATH or module is None:
            continue
        owner = module if spec.owner is None else getattr(module, spec.owner, None)
        if owner is not None:
            found.append((spec.name, _raw(owner, spec.attribute)))
    return found


def _reached(value: Any, records: dict[int, tuple[str, Any]]) -> tuple[str, Any] | None:
    """The replacing ``(target, Patch)`` that ``value`` leads to, if any."""
    seen: set[int] = set()
    while value is not None and id(value) not in seen and len(seen) < 64:
        seen.add(id(value))
        if isinstance(value, wrapt.ObjectProxy):  # rr's proxies forward __module__: unwrap
            value = value.__wrapped__
            continue
        record = records.get(id(value))
        if record is not None:
            if record[1].patch_func is not None:
                return record
            value = record[1].orig_func  # wrappers only: they call what MindSpeed wrapped
            continue
        if str(getattr(value, "__module__", "") or "").startswith("megatron."):
            return None  # Megatron's own code
        value = getattr(value, "__wrapped__", None)
    return None


def _takes_padding_mask(func: Any) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return True  # nothing to read: leave it to the run
    return any(p.name == "padding_mask" or p.kind is p.VAR_KEYWORD for p in params)


def routing_effect(func: Any, config: Any = None) -> str | None:
    """What a replacement of ``TopKRouter.routing`` does to rr's selection hook on the
    installed line: None where it still reaches the hook, else why it is refused."""
    line = rmc.megatron_line()
    if line.padding_mask and not _takes_padding_mask(func):
        return (
            f"megatron-core {line.version}'s TopKRouter.forward calls routing(logits, "
            f"padding_mask=...), which {getattr(func, '__name__', func)} does not take: the "
            "first forward raises TypeError"
        )
    if getattr(func, "__name__", None) != TP_EXTEND_EP_ROUTING or line.padding_mask:
        return "the router no longer runs Megatron's routing, so rr's selection hook is bypassed"
    source = config if config is not None else global_args()
    kind = getattr(source, "moe_router_load_balancing_type", None) or "aux_loss"
    if kind == "aux_loss":
        return None  # Megatron's aux_loss_load_balancing calls the router's (hooked) top-k
    return _TP_EXTEND_EP_012.get(
        str(kind),
        f"with moe_router_load_balancing_type={kind!r} it raises ValueError (it routes only "
        "sinkhorn, aux_loss and none)",
    )


def _trigger(feature: str, config: Any) -> str:
    source = config if config is not None else global_args()
    if source is None:
        return ""
    flags = [f"{k}={getattr(source, k)!r}" for k in _TRIGGER_FLAGS if hasattr(source, k)]
    return f"; here {', '.join(flags)}" if flags else ""


def routing_replacements(config: Any = None) -> list[Replacement]:
    """The MindSpeed replacements the router reaches now (re-read on every call; ``config``
    only names what triggered them)."""
    records: dict[int, tuple[str, Any]] = {}
    for target, patch in registry().items():
        for func in (getattr(patch, "final_patch_func", None), getattr(patch, "patch_func", None)):
            if func is not None:
                records.setdefault(id(func), (target, patch))
    if not records:
        return []
    early = rmc.megatron_line().version.release[:2] < (0, 13)
    found: list[Replacement] = []
    for name, value in _path():
        hit = _reached(value, records)
        if hit is None or any(r.target == hit[0] for r in found):
            continue
        target, patch = hit
        effect = ""
        if target == ROUTING_TARGET:
            found_effect = routing_effect(patch.patch_func, config)
            if found_effect is None:
                continue  # called through rr's proxy and reaches the selection hook
            effect = found_effect
        feature, first, later, fix = KNOWN.get(
            target, ("an unnamed feature", "registered by MindSpeed", "", "remove that patch")
        )
        trigger = (first if early or not later else later) + _trigger(feature, config)
        func = patch.patch_func
        label = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        found.append(Replacement(feature, target, name, label, trigger, fix, effect))
    return found


def check_routing_not_replaced(config: Any = None) -> None:
    """Raise :class:`RoutingReplacedError` when the router reaches a MindSpeed replacement."""
    found = routing_replacements(config)
    if found:
        line = rmc.megatron_line().version
        raise RoutingReplacedError(
            f"on megatron-core {line}: "
            + "; ".join(r.describe() for r in found)
            + ". Replay and record would bypass or break rr's hook (C7); see `rr explain C7`"
        )
