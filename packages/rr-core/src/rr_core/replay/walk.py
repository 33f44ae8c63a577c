"""Find a model's routers by walking the module tree, keyed by global layer number.

Addressing routers by position in a process-global list is how replay gets armed on orphans
(A1) or on MTP layers that restart numbering at 1 (A4). The walk starts from the model that is
actually forwarded, stays inside its decoder, and keys every router by its 1-based global
``layer_number``, so the order of ``named_modules()`` (A6) never matters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch import nn

from rr_core.checks import check_sequence
from rr_core.errors import WalkError

RouterPredicate = Callable[[nn.Module], bool]

#: Subtrees that never belong to the decoder axis (Megatron's multi-token-prediction block).
_EXCLUDED_CHILDREN = frozenset({"mtp"})


def is_router_by_name(module: nn.Module) -> bool:
    """Default predicate: a module whose class name ends in ``Router`` (``TopKRouter``...)."""
    return type(module).__name__.endswith("Router")


def decoder_scope(module: nn.Module) -> nn.Module:
    """The subtree holding the decoder layers: unwraps ``.module`` wrappers (DDP, Float16Module)
    and descends into ``.decoder`` when the model has one (Megatron's GPTModel)."""
    seen: set[int] = set()
    while id(module) not in seen:
        seen.add(id(module))
        decoder = getattr(module, "decoder", None)
        if isinstance(decoder, nn.Module):
            return decoder
        inner = getattr(module, "module", None)
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


def _layer_number(router: nn.Module, ancestors: Sequence[nn.Module], path: str) -> int:
    """The router's own ``layer_number`` if it has one, else that of its nearest ancestor."""
    for owner in (router, *reversed(ancestors)):
        number = getattr(owner, "layer_number", None)
        if isinstance(number, int) and not isinstance(number, bool):
            if number < 1:
                raise WalkError(
                    f"router at {path!r} has layer_number {number}; expected a global 1-based "
                    "layer number (>= 1)"
                )
            return number
    raise WalkError(
        f"router at {path!r} has no layer_number and no ancestor module carries one; set "
        "`layer_number` on the router or its decoder layer"
    )


def walk_routers(
    model: nn.Module | Sequence[nn.Module],
    *,
    is_router: RouterPredicate = is_router_by_name,
    scope: Callable[[nn.Module], nn.Module] = decoder_scope,
) -> list[tuple[int, nn.Module]]:
    """Yield ``(layer_number, router)`` pairs of a model or of a list of VPP chunks.

    Sorted by global layer number, each router once. Routers flagged ``is_mtp_layer`` and
    subtrees named ``mtp`` are skipped: MTP layers restart numbering at 1 and are not on the
    decoder axis. Two routers claiming one layer number raise :class:`WalkError`.
    """
    chunks = list(model) if isinstance(model, Sequence) else [model]
    bad = [type(c).__name__ for c in chunks if not isinstance(c, nn.Module)]
    if bad or not chunks:
        raise WalkError(
            "model must be an nn.Module or a non-empty sequence of them (VPP chunks); got "
            f"{type(model).__name__}" + (f" holding {', '.join(bad)}" if bad else "")
        )
    found: dict[int, tuple[int, nn.Module, str]] = {}  # id(router) -> (layer, router, path)
    for chunk_index, chunk in enumerate(chunks):
        root = scope(chunk)
        prefix = f"chunk[{chunk_index}]" if len(chunks) > 1 else type(root).__name__
        stack: list[tuple[nn.Module, str, tuple[nn.Module, ...]]] = [(root, prefix, ())]
        while stack:
            module, path, ancestors = stack.pop()
            if is_router(module):
                if getattr(module, "is_mtp_layer", False) is True:
                    continue
                if id(module) not in found:
                    found[id(module)] = (_layer_number(module, ancestors, path), module, path)
                continue
            for name, child in module.named_children():
                if name not in _EXCLUDED_CHILDREN:
                    stack.append((child, f"{path}.{name}", (*ancestors, module)))
    by_layer: dict[int, str] = {}
    for layer, _, path in found.values():
        if layer in by_layer:
            raise WalkError(
                f"two routers claim layer {layer}: {by_layer[layer]!r} and {path!r}; an MTP "
                "router that restarts numbering, or a chunk passed twice, would do this"
            )
        by_layer[layer] = path
    return sorted(((layer, router) for layer, router, _ in found.values()), key=lambda p: p[0])


def find_orphans(
    registered: Iterable[nn.Module], walked: Iterable[tuple[int, nn.Module]]
) -> list[nn.Module]:
    """Routers registered somewhere (e.g. a process-global list) that the walk of the forwarded
    model does not reach: a model built twice leaves such orphans first in the list (A1)."""
    pairs = _listed(walked, "walked")
    if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise WalkError("walked must be the (layer, router) pairs walk_routers returns")
    reached = {id(router) for _, router in pairs}
    return [router for router in _listed(registered, "registered") if id(router) not in reached]


def _listed(value: object, what: str) -> list[Any]:
    """The items of a list or an iterator (a generator is read once)."""
    return check_sequence(list(value) if isinstance(value, Iterator) else value, what, WalkError)
