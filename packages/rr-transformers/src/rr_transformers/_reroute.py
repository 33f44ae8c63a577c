"""Run a family's own routing function with its ``torch.topk`` call routed through
:func:`rr_core.router_topk`.

The function is a copy of the family's own (same code, defaults and closure) whose globals see
``torch`` as a view that differs from torch in ``topk`` alone; every other name reads the
modeling module's live namespace. So the installed release's own arithmetic (softmax or
sigmoid, expert bias, group masking, normalisation, scaling, dtype casts) runs unchanged
around the one call that picks the experts; under replay that call returns the armed ids and
the router's own scores at them, and the family's code turns those into gate weights.

Shapes: T tokens, E experts, K top-k.
"""

from __future__ import annotations

import builtins
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, router_topk


@dataclass
class _Call:
    router: nn.Module
    controller: ReplayController
    hits: int = 0


class _Frames(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Call] = []


_FRAMES = _Frames()


def _topk(
    input: torch.Tensor,  # torch.topk's own parameter names
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    out: Any = None,
) -> Any:
    """``torch.topk``, except the expert selection of the router being called: a largest top-k
    of K over the last dimension of a [T, E] tensor (a group-limited router's group pick is
    over [T, n_group] with n_group < E, so it stays torch's)."""
    call = _FRAMES.stack[-1] if _FRAMES.stack else None
    if (
        call is None
        or out is not None
        or not largest
        or not isinstance(input, torch.Tensor)
        or input.dim() != 2
        or dim not in (-1, 1)
        or input.shape[1] != call.controller.num_experts
        or k != call.controller.top_k
    ):
        return torch.topk(input, k, dim=dim, largest=largest, sorted=sorted, out=out)
    call.hits += 1
    values_TK, ids_TK = router_topk(call.router, input, k)
    return torch.return_types.topk((values_TK, ids_TK))


class _TorchView(types.ModuleType):
    """``torch`` as the rerouted function sees it: its own ``topk``, all else torch's."""

    topk = staticmethod(_topk)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_TORCH_VIEW = _TorchView("torch")


class _Globals(dict[str, Any]):
    """A modeling module's namespace with ``torch`` replaced; other names read through to the
    module's own dict, so later changes there stay visible."""

    def __init__(self, module_globals: dict[str, Any]) -> None:
        super().__init__(
            torch=_TORCH_VIEW, __builtins__=module_globals.get("__builtins__", builtins)
        )
        self._module_globals = module_globals

    def __missing__(self, key: str) -> Any:
        return self._module_globals[key]


def rerouted(function: types.FunctionType) -> types.FunctionType:
    """A copy of ``function`` whose ``torch.topk`` calls go through :func:`_topk`. The copy and
    its namespace view belong to the proxy that holds them (no table here keeps either), so
    they go with the proxy when uninstall takes it out."""
    view = _Globals(function.__globals__)
    copy = types.FunctionType(
        function.__code__, view, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    return copy


def call_routed(
    function: Callable[..., Any],
    router: nn.Module,
    controller: ReplayController,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, int]:
    """Call ``function`` with ``router``'s expert selection routed; returns (result, how many
    top-k calls were routed)."""
    call = _Call(router, controller)
    _FRAMES.stack.append(call)
    try:
        return function(*args, **kwargs), call.hits
    finally:
        _FRAMES.stack.pop()
