"""MindSpeed's pre-patches must run before Megatron is imported.

MindSpeed's adaptor replaces ``torch.compile`` (and ``torch.jit.script``) with a pass-through
before it imports Megatron, and patches only module attributes that *are* ``torch.compile`` at
that moment. Megatron binds ``megatron.core.jit.jit_fuser = torch.compile`` at import, so where
Megatron was imported first every ``@jit_fuser`` function keeps the real compiler and the first
forward fails inside dynamo. rr_npu never imports Megatron before MindSpeed (its install waits
until Megatron is loaded); this check names the order when something else did.
"""

from __future__ import annotations

import sys

from rr_core import RRError
from rr_npu._mindspeed import registry

JIT_MODULE = "megatron.core.jit"
COMPILE_TARGET = "torch.compile"


class MindSpeedOrderError(RRError):
    """Megatron was imported before MindSpeed's pre-patches (an unsupported order)."""


def check_import_order() -> None:
    """Raise :class:`MindSpeedOrderError` when MindSpeed replaced ``torch.compile`` but
    Megatron's ``jit_fuser`` still holds the original (Megatron was imported first)."""
    patch = registry().get(COMPILE_TARGET)
    jit = sys.modules.get(JIT_MODULE)
    if patch is None or jit is None or not getattr(patch, "is_applied", False):
        return
    if getattr(patch, "patch_func", None) is None:
        return
    fuser = vars(jit).get("jit_fuser")
    if fuser is not None and fuser is getattr(patch, "orig_func", None):
        raise MindSpeedOrderError(
            "megatron.core was imported before MindSpeed's pre-patches: "
            "megatron.core.jit.jit_fuser is still the real torch.compile while MindSpeed "
            f"replaced torch.compile with {getattr(patch.patch_func, '__qualname__', '?')}, so "
            "@jit_fuser functions compile with dynamo on the first forward and fail there. "
            "Import mindspeed.megatron_adaptor before anything imports megatron (rr_npu.install() "
            "does not import Megatron, so it may come first or after); see `rr explain C8`"
        )
