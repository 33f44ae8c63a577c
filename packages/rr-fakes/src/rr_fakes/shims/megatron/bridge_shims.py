"""Megatron-Bridge's real model builders on CPU (Python 3.11, no Transformer Engine).

:func:`bridge_cpu` runs inside :func:`rr_fakes.shims.megatron.megatron_cpu` and adds what a bridge
release needs beyond megatron-core's own harness, each only as long as the context lasts:

- ``typing.override``: bridge 0.6.2 declares Python >= 3.12 and imports it from ``typing``
  (3.12+); on 3.11 the ``typing_extensions`` backport stands in;
- modules bridge imports unconditionally for what replay never builds, where they are absent:
  Transformer Engine (``megatron.bridge.peft.lora_layers``, for its LoRA classes) and
  ``transformers.modeling_attn_mask_utils`` (Bailing-MoE's modeling code; transformers 5.24
  no longer ships it, 5.10.4 does). A placeholder answers those importers only, and no module
  sees it in ``sys.modules`` (so megatron-core's and bridge's own ``HAVE_TE`` probes stay False);
- ``torch.cuda.nvtx`` ranges, which Qwen3-VL's forward pushes and pops: no-ops;
- local layer specs: the providers that hard-code Megatron's Transformer Engine layer spec, and
  the MTP block spec bridge always asks for with ``use_transformer_engine=True``, get Megatron's
  local (plain torch) modules instead.

:func:`provide_model` builds through bridge's random-initialisation path, the one verl's
engine calls: ``AutoBridge.from_hf_config(cfg).to_megatron_provider(load_weights=False)``,
``apply_overrides_and_finalize`` and ``provide_distributed_model(wrap_with_ddp=False)``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from rr_core.patching import Patches
from rr_fakes.shims.megatron._cpu_fields import CPU_TRANSFORMER_FIELDS
from rr_fakes.shims.megatron._nested import outermost_under_megatron_cpu

#: Per module of megatron-bridge 0.6.2, a module it imports unconditionally that may be absent
#: and that building a replayed model never uses (the module docstring).
PLACEHOLDER_IMPORTS: Mapping[str, str] = {
    "megatron.bridge.peft.lora_layers": "transformer_engine",
    "megatron.bridge.models.bailing.modeling_bailing_moe_v2": (
        "transformers.modeling_attn_mask_utils"
    ),
}

#: Provider fields every CPU build sets: :data:`CPU_TRANSFORMER_FIELDS` (no fusions,
#: SequentialMLP experts, CPU initialisation) and verl's own replay-path overrides (alltoall
#: dispatcher, no load-balancing loss).
CPU_OVERRIDES: Mapping[str, Any] = {
    **CPU_TRANSFORMER_FIELDS,
    "moe_token_dispatcher_type": "alltoall",
    "moe_router_load_balancing_type": "none",
}


class _Absent(type):
    """Every attribute of the placeholder is the placeholder (``te.ops.Sequential`` in an
    annotation, ``te.Linear`` in an ``isinstance``, a function imported by name); calling one
    raises."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{cls.__qualname__} is not installed (rr_fakes' import placeholder)")


#: What a placeholder's error calls the package it stands for.
_DISPLAY_NAMES = {"transformer_engine": "Transformer Engine"}


def _placeholder(name: str) -> types.ModuleType:
    """A module ``name`` whose every attribute is a placeholder."""
    absent = _Absent(_DISPLAY_NAMES.get(name, name), (), {})

    class Module(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return absent

    return Module(name)


@contextlib.contextmanager
def _placeholders_for(imports: Mapping[str, str]) -> Iterator[None]:
    """An import of ``imports[importer]`` (or a submodule) from ``importer`` that fails gets
    its placeholder; every other import (and ``sys.modules``) is left as it is."""
    original = builtins.__import__
    placeholders = {name: _placeholder(name) for name in set(imports.values())}

    def import_(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        wanted = imports.get((globals or {}).get("__name__", ""))
        if level == 0 and wanted and (name == wanted or name.startswith(wanted + ".")):
            try:
                return original(name, globals, locals, fromlist, level)
            except ImportError:
                return placeholders[wanted]
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = import_
    try:
        yield
    finally:
        builtins.__import__ = original


def _local_layer_spec(*, num_experts: Any = None, qk_layernorm: bool = False, **_: Any) -> Any:
    """Megatron's local counterpart of ``get_gpt_layer_with_transformer_engine_spec`` (the TE
    switches are dropped). The norms follow ``config.normalization`` at build time, as TE's do:
    without apex the local spec's norm is WrappedTorchNorm, which reads it."""
    specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
    return specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=qk_layernorm
    )


def _local_mtp_block_spec(original: Any) -> Any:
    @functools.wraps(original)
    def get_gpt_mtp_block_spec(
        config: Any, spec: Any, use_transformer_engine: bool, **kw: Any
    ) -> Any:
        return original(config, spec, use_transformer_engine=False, **kw)

    return get_gpt_mtp_block_spec


def _nvtx_push(msg: str) -> None:
    pass


def _nvtx_pop() -> None:
    pass


def _use_local_specs(patches: Patches) -> None:
    """Every bridge module that bound Megatron's TE layer-spec function (``import
    megatron.bridge`` imports every model's provider) builds local layers instead."""
    specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
    te_spec = specs.get_gpt_layer_with_transformer_engine_spec
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("megatron.bridge.")
            and vars(module).get("get_gpt_layer_with_transformer_engine_spec") is te_spec
        ):
            patches.set(module, "get_gpt_layer_with_transformer_engine_spec", _local_layer_spec)
    # bridge's mtp_block_spec imports this name from the module when it is called
    patches.set(
        specs, "get_gpt_mtp_block_spec", _local_mtp_block_spec(specs.get_gpt_mtp_block_spec)
    )


@outermost_under_megatron_cpu
def bridge_cpu() -> Iterator[None]:
    """Import and build Megatron-Bridge models on CPU inside this context (see the module
    docstring for what it shims); everything is put back on exit. Nested entries share the
    outer one."""
    patches = Patches()
    try:
        if not hasattr(typing, "override"):  # Python 3.11
            patches.set(typing, "override", importlib.import_module("typing_extensions").override)
        nvtx = importlib.import_module("torch.cuda.nvtx")
        patches.set(nvtx, "range_push", _nvtx_push)
        patches.set(nvtx, "range_pop", _nvtx_pop)
        with _placeholders_for(PLACEHOLDER_IMPORTS):
            importlib.import_module("megatron.bridge")
        _use_local_specs(patches)
        yield
    finally:
        patches.restore(force=True)


@functools.cache
def unavailable_reason() -> str | None:
    """Why Megatron-Bridge cannot be used in this process, or None when it can (cached)."""
    from rr_fakes.shims.megatron._shims import unavailable_reason as megatron_reason

    reason = megatron_reason()
    if reason is not None:
        return reason
    try:
        with bridge_cpu():
            pass
    except ImportError as error:
        return f"megatron-bridge unavailable: {error!r}"
    return None


def provide_model(
    hf_config: Any,
    overrides: Mapping[str, Any] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> list[nn.Module]:
    """This rank's model chunks from ``hf_config`` (a transformers config naming an architecture
    bridge knows), built as verl's engine builds them: bridge's provider without weights,
    :data:`CPU_OVERRIDES` then ``overrides`` applied by bridge's own
    ``apply_overrides_and_finalize``, and ``provide_distributed_model(wrap_with_ddp=False)``.
    Call inside :func:`bridge_cpu` and :func:`rr_fakes.shims.megatron.model_parallel`."""
    bridge = importlib.import_module("megatron.bridge")
    provider = bridge.AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)
    provider.apply_overrides_and_finalize(
        dtype=dtype, overrides={**CPU_OVERRIDES, **(overrides or {})}
    )
    chunks: list[nn.Module] = provider.provide_distributed_model(wrap_with_ddp=False)
    return chunks
