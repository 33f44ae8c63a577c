"""What rr reads of a loaded MindSpeed: its patch registry, and whether Megatron's config classes
still show their real signatures. Nothing here imports mindspeed (``sys.modules`` only).

MindSpeed's registry (``mindspeed/patch_utils.py``) is ``MindSpeedPatchesManager.patches_info``:
one ``Patch`` per dotted target, kept for the life of the process. ``orig_func_name`` is the
attribute's name (a string), ``patch_func`` the replacement (None when only wrappers are
registered, and after removal), ``wrappers`` the decorators stacked over it, ``orig_func`` what
was there at the first apply and ``final_patch_func`` what MindSpeed set.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from rr_core import RRError
from rr_core.patching import Patches

PATCH_UTILS = "mindspeed.patch_utils"
ARGS_UTILS = "mindspeed.args_utils"
CONFIG_CLASSES = ("TransformerConfig", "MLATransformerConfig")
TRANSFORMER_CONFIG_MODULE = "megatron.core.transformer.transformer_config"


class ConfigSignatureError(RRError):
    """A config ``__init__`` hides its signature; MindSpeed's rebuild then drops every field."""


def patch_manager() -> Any:
    """MindSpeed's patch manager if MindSpeed is loaded, else None."""
    module = sys.modules.get(PATCH_UTILS)
    return None if module is None else getattr(module, "MindSpeedPatchesManager", None)


def registry() -> dict[str, Any]:
    """MindSpeed's ``patches_info`` now (empty without MindSpeed)."""
    table = getattr(patch_manager(), "patches_info", None)
    return table if isinstance(table, dict) else {}


def global_args() -> Any:
    """MindSpeed's global arguments (``get_full_args()``), or None where they cannot be read."""
    module = sys.modules.get(ARGS_UTILS)
    try:
        return None if module is None else module.get_full_args()
    except Exception:
        return None


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


def mark_pass_throughs(patches: Patches) -> None:
    """Give each wrapper-only MindSpeed patch a ``__wrapped__`` (its record's ``orig_func``)
    where its wrapper left none, so rr sees its own hook under MindSpeed's pass-through (one
    MindSpeed applied first over rr's proxy) instead of hooking the attribute twice. Set through
    ``patches`` (the adapter's registry): uninstall takes the marks off MindSpeed's functions."""
    for patch in registry().values():
        final = getattr(patch, "final_patch_func", None)
        original = getattr(patch, "orig_func", None)
        if getattr(patch, "patch_func", True) is not None or final is None or final is original:
            continue  # a replacement, or nothing stacked over the original
        if not getattr(patch, "wrappers", None) or original is None:
            continue
        if getattr(final, "__wrapped__", None) is None:
            try:
                patches.set(final, "__wrapped__", original)
            except (AttributeError, TypeError):  # not a function object: leave it
                continue
