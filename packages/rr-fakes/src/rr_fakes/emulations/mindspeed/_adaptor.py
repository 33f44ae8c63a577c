"""MegatronAdaptor ("MA"), as far as MindSpeed's source shows it (core_r0.17.0, core_r0.18.0).

On those lines ``mindspeed/__init__.py`` begins with ``import megatron_adaptor``: the separate
MegatronAdaptor package (published outside GitHub; its source was not read here) is imported
with the ``mindspeed`` package, before anything of MindSpeed's runs, and MindSpeed's own
pre-patches are gone ("already covered by MA", ``NpuEnhancementFeature``; its README: MA brings
RNG, softmax, device detection and Transformer Engine dummy modules, installed and imported
before Megatron). What the emulation assumes of it is only what MindSpeed no longer does itself
on those lines and needs done before Megatron is imported: ``torch.compile`` and
``torch.jit.script`` replaced by a pass-through, kept in MA's own record (not in MindSpeed's
patch registry).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from rr_fakes.emulations.mindspeed._requirements import dummy_compile

MEGATRON_ADAPTOR = "megatron_adaptor"
_TARGETS = ((torch, "compile"), (torch.jit, "script"))


def import_megatron_adaptor() -> types.ModuleType:
    """``import megatron_adaptor``: the module in ``sys.modules`` (after whatever was imported
    before it) and its replacements made."""
    module = types.ModuleType(MEGATRON_ADAPTOR, "Emulated MegatronAdaptor (rr_fakes).")
    module.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
    module.originals = [(owner, name, getattr(owner, name)) for owner, name in _TARGETS]  # type: ignore[attr-defined]
    sys.modules[MEGATRON_ADAPTOR] = module
    for owner, name in _TARGETS:
        setattr(owner, name, dummy_compile)
    return module


def remove_megatron_adaptor() -> None:
    module: Any = sys.modules.pop(MEGATRON_ADAPTOR, None)
    for owner, name, original in getattr(module, "originals", ()):
        setattr(owner, name, original)
