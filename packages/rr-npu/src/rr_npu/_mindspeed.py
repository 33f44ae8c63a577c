"""What rr needs to know about a loaded MindSpeed: its patch manager, the features that replace
Megatron's routing, and whether Megatron's config classes still show their real signatures.

MindSpeed features that replace routing bypass any hook on the originals: ``moe_tp_extend_ep``
with the ``alltoall_seq`` dispatcher replaces ``TopKRouter.routing``; ``fix_router`` replaces
``topk_softmax_with_capacity``. They are detected from the patch manager's registrations and
from the flags MindSpeed merges into every config, and refused with
:class:`RoutingReplacedError`. Nothing here imports mindspeed: it is looked up in
``sys.modules`` only.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from rr_core import RRError

PATCH_UTILS = "mindspeed.patch_utils"
#: (patched attribute suffix, MindSpeed feature, what it replaces)
ROUTING_TARGETS: tuple[tuple[str, str], ...] = (
    ("TopKRouter.routing", "moe_tp_extend_ep (with the alltoall_seq dispatcher)"),
    ("topk_softmax_with_capacity", "fix_router"),
)
CONFIG_CLASSES = ("TransformerConfig", "MLATransformerConfig")
TRANSFORMER_CONFIG_MODULE = "megatron.core.transformer.transformer_config"


class RoutingReplacedError(RRError):
    """A MindSpeed feature replaces Megatron's routing, so replay hooks would be bypassed."""


class ConfigSignatureError(RRError):
    """A config ``__init__`` hides its signature; MindSpeed's rebuild then drops every field."""


def patch_manager() -> Any:
    """MindSpeed's patch manager if MindSpeed is loaded, else None."""
    module = sys.modules.get(PATCH_UTILS)
    return None if module is None else getattr(module, "MindSpeedPatchesManager", None)


def _registrations(manager: Any) -> dict[str, Any]:
    for name in ("patches", "patches_info"):
        table = getattr(manager, name, None)
        if isinstance(table, dict):
            return table
    return {}


def _replaces(patch: Any) -> bool:
    """Does a registration replace its target (rather than stack a wrapper)?"""
    if hasattr(patch, "replacement"):
        return patch.replacement is not None
    func = getattr(patch, "orig_func_name", None) or getattr(patch, "patch_func", None)
    name = getattr(func, "__name__", "")
    return not name.endswith(("wrapper", "decorator"))


def routing_replacements(config: Any = None) -> list[str]:
    """MindSpeed features active now that replace routing (patch registrations, and the flags
    on ``config`` when given)."""
    found: list[str] = []
    manager = patch_manager()
    if manager is not None:
        for target, patch in _registrations(manager).items():
            for suffix, feature in ROUTING_TARGETS:
                if target.endswith(suffix) and _replaces(patch) and feature not in found:
                    found.append(feature)
    if config is not None:
        extend_ep = bool(getattr(config, "moe_tp_extend_ep", False))
        dispatcher = getattr(config, "moe_token_dispatcher_type", None)
        if extend_ep and dispatcher == "alltoall_seq" and ROUTING_TARGETS[0][1] not in found:
            found.append(ROUTING_TARGETS[0][1])
        if getattr(config, "fix_router", False) and ROUTING_TARGETS[1][1] not in found:
            found.append(ROUTING_TARGETS[1][1])
    return found


def check_routing_not_replaced(config: Any = None) -> None:
    """Raise :class:`RoutingReplacedError` when a MindSpeed feature replaces routing."""
    found = routing_replacements(config)
    if found:
        raise RoutingReplacedError(
            f"MindSpeed features {found} replace Megatron's routing, so routing replay would "
            "be silently bypassed; turn them off for RL training with replay (drop "
            "--moe-tp-extend-ep or use the alltoall dispatcher; drop --fix-router)"
        )


def check_config_signatures() -> None:
    """Raise :class:`ConfigSignatureError` when a loaded Megatron config class hides its
    parameters behind ``(*args, **kwargs)`` (a wrapper without ``functools.wraps``): MindSpeed
    then treats every field as unknown and construction fails with ZeroDivisionError."""
    module = sys.modules.get(TRANSFORMER_CONFIG_MODULE)
    if module is None:
        return
    for name in CONFIG_CLASSES:
        klass = getattr(module, name, None)
        if klass is None:
            continue
        params = inspect.signature(klass).parameters
        if "num_layers" not in params:
            init = klass.__init__
            raise ConfigSignatureError(
                f"{name}.__init__ is wrapped by {getattr(init, '__module__', '?')}."
                f"{getattr(init, '__qualname__', init)!r} without functools.wraps; "
                f"inspect.signature({name}) shows {list(params)} so MindSpeed's config rebuild "
                "drops every field. Wrap with functools.wraps (or wrapt) to keep the signature"
            )
