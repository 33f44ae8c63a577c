"""MindSpeed's pre-patches must run before Megatron is imported.

Megatron binds ``megatron.core.jit.jit_fuser = torch.compile`` at import and decorates its fused
functions with it there and then; MindSpeed's replacement of ``torch.compile`` by a pass-through
must therefore come first, or every ``@jit_fuser`` function keeps the real compiler and the
first forward fails inside dynamo. What shows the order differs per MindSpeed line:

- 0.12 / 0.16: MindSpeed's own pre-patch on ``torch.compile`` is in its registry; its
  ``orig_func`` is the real ``torch.compile``, and ``jit_fuser`` still holding that very
  function means Megatron was imported first.
- 0.17 / 0.18: MindSpeed registers no pre-patch; ``mindspeed/__init__.py`` imports the
  MegatronAdaptor (``megatron_adaptor``) first, which covers them. ``sys.modules`` keeps modules
  in the order they were first imported, so ``megatron.core`` ahead of ``megatron_adaptor``
  means Megatron came first.
- Any line: ``torch.compile`` replaced while ``jit_fuser`` still is the real one (the function
  defined in ``torch/__init__.py``).

rr_npu never imports Megatron before MindSpeed (its install waits until Megatron is loaded);
this check names the order when something else did.
"""

from __future__ import annotations

import sys
from typing import Any

from rr_core import RRError
from rr_npu._mindspeed import patch_manager, registry

JIT_MODULE = "megatron.core.jit"
MEGATRON_CORE = "megatron.core"
MEGATRON_ADAPTOR = "megatron_adaptor"
COMPILE_TARGET = "torch.compile"


class MindSpeedOrderError(RRError):
    """Megatron was imported before MindSpeed's pre-patches (an unsupported order)."""


def _is_real_torch_compile(value: Any) -> bool:
    """Is ``value`` the ``torch.compile`` that torch defines (not a replacement of it)?"""
    torch = sys.modules.get("torch")
    code = getattr(value, "__code__", None)
    source = getattr(torch, "__file__", None)
    return code is not None and code.co_name == "compile" and code.co_filename == source


def _qualname(value: Any) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', value)}"


def order_evidence() -> list[str]:
    """What shows that Megatron was imported before MindSpeed's pre-patches (empty: nothing)."""
    jit = sys.modules.get(JIT_MODULE)
    if jit is None or (patch_manager() is None and MEGATRON_ADAPTOR not in sys.modules):
        return []
    fuser = vars(jit).get("jit_fuser")
    found = []
    patch = registry().get(COMPILE_TARGET)
    if (
        patch is not None
        and getattr(patch, "is_applied", False)
        and getattr(patch, "patch_func", None) is not None
        and fuser is not None
        and fuser is getattr(patch, "orig_func", None)
    ):
        found.append(
            "MindSpeed replaced torch.compile with "
            f"{_qualname(patch.patch_func)}, but megatron.core.jit.jit_fuser is still the real "
            "torch.compile"
        )
    order = list(sys.modules)
    both = MEGATRON_ADAPTOR in sys.modules and MEGATRON_CORE in sys.modules
    if both and order.index(MEGATRON_CORE) < order.index(MEGATRON_ADAPTOR):
        found.append(
            "megatron.core was imported before the MegatronAdaptor (megatron_adaptor, which "
            "mindspeed/__init__.py imports first on MindSpeed's 0.17 / 0.18 lines)"
        )
    current = getattr(sys.modules.get("torch"), "compile", None)
    if not found and _is_real_torch_compile(fuser) and current is not fuser:
        found.append(
            f"torch.compile is now {_qualname(current)}, but megatron.core.jit.jit_fuser is "
            "still the real torch.compile"
        )
    return found


def check_import_order() -> None:
    """Raise :class:`MindSpeedOrderError` when Megatron was imported before MindSpeed's
    pre-patches (see the module doc for what shows it on each line)."""
    found = order_evidence()
    if found:
        raise MindSpeedOrderError(
            "megatron.core was imported before MindSpeed's pre-patches: "
            + "; ".join(found)
            + ". The @jit_fuser functions (megatron.core.jit.jit_fuser) were decorated with "
            "the real torch.compile, so they compile with dynamo on the first forward and fail "
            "there. Import mindspeed.megatron_adaptor before anything imports megatron "
            "(rr_npu.install() does not import Megatron, so it may come first or after); see "
            "`rr explain C8`"
        )
