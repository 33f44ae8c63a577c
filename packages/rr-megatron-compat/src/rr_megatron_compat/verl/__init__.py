"""verl's router-replay API, backed by rr.

One line switches every verl side rr supports, without editing verl::

    import rr_megatron_compat.verl
    rr_megatron_compat.verl.install()  # before or after verl's modules are imported

verl's Megatron engine here; its FSDP engine where rr-transformers is installed; its rollout
(agent loop, trainer padding) where rr-vllm is installed. Each side is installed when the
process imports its verl module (see :mod:`rr_megatron_compat.verl._switch`), so the same line
works as Ray's ``worker_process_setup_hook`` in every verl worker. ``ADAPTER`` is the Megatron
side alone.

Or a verl checkout replaces its two imports::

    from verl.utils.megatron.router_replay_patch import ...
    from verl.utils.megatron.router_replay_utils import ...

with ``from rr_megatron_compat.verl import ...``.

Names, parameters and defaults are verl's (0.9). Behind them every model chunk is driven by an
:class:`rr_core.ReplayController` attached by walking the chunk (never a process-global router
list), targets are keyed by micro-batch (never a FIFO of pops), and whatever cannot be replayed
exactly raises instead of routing natively. Importing this module imports neither megatron nor
any verl code.

The module's names are verl's two modules' names: what they define, and what they import
that a test or a fix could replace (``mpu``, ``TopKRouter``, ``get_schedule_table``, the
sequence-parallel collectives, the THD packing functions, ``device_name``, ...). rr's code reads
those it calls as attributes of one object, :data:`rr_megatron_compat.verl._names.NAMES`;
replacing one here replaces it there, so it changes what rr does. Megatron's
objects among them load on first use. See the package README, "Migrating from verl", for the
differences.
"""

from __future__ import annotations

import inspect
import sys
import types
import warnings
from enum import Enum
from functools import wraps
from typing import Any

import torch

from rr_megatron_compat.verl import _names
from rr_megatron_compat.verl._helper import (
    RouterReplayHelper,
    iter_model_routers,
    set_model_router_replay_action,
)
from rr_megatron_compat.verl._install import ADAPTER
from rr_megatron_compat.verl._layers import (
    get_current_rank_layer_info,
    get_moe_num_layers_to_build,
    get_num_layers_to_build,
    is_moe_layer,
    pp_gather,
    reorder_and_merge_vpp_layers,
)

# verl's helpers, rr's versions under verl's names (replaceable here: rr calls them from here)
from rr_megatron_compat.verl._names import (
    _context_parallel_layout,
    gather_from_sequence_parallel_region,
    get_device_name,
    get_transformer_layer_offset,
    scatter_to_sequence_parallel_region,
)
from rr_megatron_compat.verl._packing import (
    postprocess_packed_seqs,
    postprocess_thd_engine,
    preprocess_packed_seqs,
    preprocess_thd_engine,
)
from rr_megatron_compat.verl._r3 import align_r3_router_replay_data, build_r3_replay_mask
from rr_megatron_compat.verl._routes import (
    merge_nested_router_maps,
    merge_router_topk_indices,
    set_router_replay_data,
)
from rr_megatron_compat.verl._switch import Side, install, is_installed, sides, uninstall
from rr_megatron_compat.verl._views import RouterReplay, RouterReplayAction

__all__ = [
    "ADAPTER",
    "RouterReplay",
    "RouterReplayAction",
    "RouterReplayHelper",
    "Side",
    "align_r3_router_replay_data",
    "apply_router_replay_patch",
    "attach",
    "build_r3_replay_mask",
    "detach",
    "get_current_rank_layer_info",
    "get_moe_num_layers_to_build",
    "get_num_layers_to_build",
    "install",
    "is_installed",
    "is_moe_layer",
    "iter_model_routers",
    "merge_nested_router_maps",
    "merge_router_topk_indices",
    "pp_gather",
    "remove_router_replay_patch",
    "reorder_and_merge_vpp_layers",
    "set_model_router_replay_action",
    "set_router_replay_data",
    "sides",
    "uninstall",
]


#: verl's names for Megatron objects, loaded on first use: (module, attribute).
_MEGATRON = _names.MEGATRON

#: install / uninstall / is_installed are the switch of every verl side (_switch); attach /
#: detach are the Megatron side's, rr_megatron_compat's (verl's models are Megatron's)
attach, detach = ADAPTER.attach, ADAPTER.detach

# verl's functions rr does not take over: each raises, naming what to use instead
patched_routing = _names.patched_routing
_patched_topk_routing_with_score_function = _names._patched_topk_routing_with_score_function
_get_aux_loss_coeff = _names._get_aux_loss_coeff
_is_aux_loss_enabled = _names._is_aux_loss_enabled

#: verl's module-level names beyond rr's API (verl's standard-library imports among them).
VERL_MODULE_NAMES = (
    *_MEGATRON,
    "device_name",
    "get_device_name",
    "_context_parallel_layout",
    "gather_from_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
    "get_transformer_layer_offset",
    "preprocess_packed_seqs",
    "postprocess_packed_seqs",
    "preprocess_thd_engine",
    "postprocess_thd_engine",
    "patched_routing",
    "_patched_topk_routing_with_score_function",
    "_get_aux_loss_coeff",
    "_is_aux_loss_enabled",
    "inspect",
    "types",
    "warnings",
    "Enum",
    "wraps",
    "torch",
)
_STDLIB = (inspect, types, warnings, Enum, wraps, torch)  # verl's modules import them


def apply_router_replay_patch() -> None:
    """Install rr's router hooks for the installed Megatron line, remember every ``TopKRouter``
    built from now on whose config enables replay (``RouterReplay.router_instances``), and give
    routers a ``router_replay`` on lines without a native one (idempotent). On 0.16+ build the
    model from a config with ``moe_enable_routing_replay`` (verl's engine sets it, or
    :func:`rr_megatron_compat.enable_replay`); rr adds no ``enable_routing_replay`` parameter
    to ``TransformerConfig``."""
    from rr_megatron_compat.verl._install import apply_router_patch

    apply_router_patch()


def remove_router_replay_patch() -> None:
    """rr only: detach every model used through this module, forget the routers and remove
    what :func:`apply_router_replay_patch` installed."""
    from rr_megatron_compat.verl._install import remove_router_patch

    remove_router_patch()


def _api() -> dict[str, Any]:
    """rr's public API as this module holds it now (what install() puts in verl's modules)."""
    return {name: globals()[name] for name in __all__}


ADAPTER.api = _api
_names.NAMES.provide(
    get_device_name=get_device_name,
    _context_parallel_layout=_context_parallel_layout,
    scatter_to_sequence_parallel_region=scatter_to_sequence_parallel_region,
    gather_from_sequence_parallel_region=gather_from_sequence_parallel_region,
    get_transformer_layer_offset=get_transformer_layer_offset,
    get_num_layers_to_build=get_num_layers_to_build,
    get_current_rank_layer_info=get_current_rank_layer_info,
    is_moe_layer=is_moe_layer,
    RouterReplayHelper=RouterReplayHelper,
    preprocess_packed_seqs=preprocess_packed_seqs,
    postprocess_packed_seqs=postprocess_packed_seqs,
    preprocess_thd_engine=preprocess_thd_engine,
    postprocess_thd_engine=postprocess_thd_engine,
)
_READ = frozenset(_names.VerlNames.names())  # the names rr reads through _names.NAMES


class _Module(types.ModuleType):
    """This module: replacing one of the names rr reads (``rv.mpu = ...``) replaces it in
    :data:`rr_megatron_compat.verl._names.NAMES`, where rr reads it."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in _READ:
            _names.NAMES.replace(name, value)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        if name in _READ:
            _names.NAMES.restore(name)


sys.modules[__name__].__class__ = _Module


def __getattr__(name: str) -> Any:
    # Megatron's objects load on first use (importing this module imports no megatron);
    # device_name is verl's module constant, read when asked
    if name in _MEGATRON or name == "device_name":
        return _names.NAMES.read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
