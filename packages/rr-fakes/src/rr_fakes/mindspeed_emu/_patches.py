"""An emulation of MindSpeed's patch manager, written from its documented behaviour.

What it mirrors (see ``npu-facts.md``, "How MindSpeed patches Megatron"):

- patches are registered by dotted name (``package.module.Class.attribute``);
- a function whose ``__name__`` ends in ``wrapper`` or ``decorator`` is stacked as a decorator
  around the original, any other function replaces it, and replacing twice without ``force``
  raises;
- applying ``setattr``s the result on the owner **and on every module in ``sys.modules`` whose
  attribute of that name is the current object**, so ``from x import f`` copies follow;
- the original is remembered **only the first time** a target is applied; later applies (after a
  remove, or in a ``repatch``) wrap that first original again, which silently discards anything
  another library installed on the attribute in between;
- removing restores module attributes but not class attributes;
- ``is_applied`` is a plain bool attribute.

:meth:`PatchManager.restore_everything` goes beyond MindSpeed (which never restores class
attributes): the emulation's context manager calls it on exit so no test leaks a patch.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_STACKING_SUFFIXES = ("wrapper", "decorator")


def resolve_owner(dotted: str) -> tuple[Any, str]:
    """``(owner, attribute)`` for ``package.module[.Class].attribute``: the longest importable
    module prefix, then attribute lookups for the rest."""
    parts = dotted.split(".")
    if len(parts) < 2:
        raise ValueError(f"patch target {dotted!r} needs at least 'module.attribute'")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise ImportError(f"no importable module prefix in patch target {dotted!r}")


def is_stacking(func: Callable[..., Any]) -> bool:
    """Does MindSpeed stack ``func`` as a decorator (name ends in wrapper / decorator)?"""
    return getattr(func, "__name__", "").endswith(_STACKING_SUFFIXES)


@dataclass
class Patch:
    """What is registered on one dotted target: at most one replacement, any number of
    stacked wrappers (applied in registration order, the last one outermost)."""

    target: str
    replacement: Callable[..., Any] | None = None
    wrappers: list[Callable[..., Any]] = field(default_factory=list)
    is_applied: bool = False

    def add(self, func: Callable[..., Any], *, force: bool) -> None:
        if is_stacking(func):
            self.wrappers.append(func)
        elif self.replacement is not None and not force:
            raise RuntimeError(
                f"the patch of {self.target} exists already ({self.replacement!r}); "
                "pass force_patch=True to replace it"
            )
        else:
            self.replacement = func
        self.is_applied = False

    def build(self, original: Any) -> Any:
        result = original if self.replacement is None else self.replacement
        for wrapper in self.wrappers:
            result = wrapper(result)
        return result


@dataclass
class _Original:
    owner: Any
    name: str
    value: Any
    own: bool  # the name was in the owner's own __dict__ (not inherited, not absent)


class PatchManager:
    """MindSpeed's patch manager, as an instance (MindSpeed keeps the same state on a class).

    ``register_patch`` / ``apply_patches`` / ``remove_patches`` mirror MindSpeed;
    ``originals`` is the first-original memory, kept across removes.
    """

    def __init__(self) -> None:
        self.patches: dict[str, Patch] = {}
        self.is_applied: bool = False
        self.originals: dict[str, _Original] = {}
        self._installed: dict[str, Any] = {}  # target -> object this manager last set

    def register_patch(
        self,
        target: str,
        new_func: Callable[..., Any] | None = None,
        force_patch: bool = False,
        create_dummy: bool = False,
    ) -> None:
        """Register ``new_func`` on ``target``; a missing ``new_func`` with ``create_dummy``
        registers a function that raises when called (MindSpeed's dummy for absent names)."""
        if new_func is None:
            if not create_dummy:
                raise ValueError(f"register_patch({target!r}) needs new_func or create_dummy")
            new_func = _dummy(target)
        self.patches.setdefault(target, Patch(target)).add(new_func, force=force_patch)

    def apply_patches(self) -> None:
        for patch in self.patches.values():
            self._apply(patch)
        self.is_applied = True

    def _apply(self, patch: Patch) -> None:
        if patch.is_applied:
            return
        owner, name = resolve_owner(patch.target)
        current = getattr(owner, name, None)
        remembered = self.originals.get(patch.target)
        if remembered is None:
            own = name in getattr(owner, "__dict__", {})
            remembered = _Original(owner, name, current, own)
            self.originals[patch.target] = remembered
        new = patch.build(remembered.value)
        setattr(owner, name, new)
        if current is not None:
            _propagate(name, current, new)
        self._installed[patch.target] = new
        patch.is_applied = True

    def remove_patches(self) -> None:
        """Undo every patch on module owners (class owners keep the patched attribute, as in
        MindSpeed) and forget the registrations; the first-original memory stays."""
        for target, patch in self.patches.items():
            if not patch.is_applied:
                continue
            original = self.originals[target]
            installed = self._installed.pop(target, None)
            if isinstance(original.owner, types.ModuleType):
                setattr(original.owner, original.name, original.value)
                if installed is not None:
                    _propagate(original.name, installed, original.value)
        self.patches.clear()
        self.is_applied = False

    def restore_everything(self) -> None:
        """Put back every attribute this manager ever changed, class attributes too (used by
        the emulation on exit; MindSpeed itself has no such step)."""
        for target, original in self.originals.items():
            installed = self._installed.pop(target, getattr(original.owner, original.name, None))
            if original.own:
                setattr(original.owner, original.name, original.value)
            elif original.name in getattr(original.owner, "__dict__", {}):
                delattr(original.owner, original.name)
            if installed is not None and original.value is not None:
                _propagate(original.name, installed, original.value)
        self.originals.clear()
        self.patches.clear()
        self.is_applied = False


def _propagate(name: str, current: Any, new: Any) -> None:
    """Replace ``current`` by ``new`` on every loaded module that holds it under ``name``."""
    for module in list(sys.modules.values()):
        if module is None:
            continue
        try:
            held = module.__dict__.get(name, None)
        except AttributeError:
            continue
        if held is current and held is not new:
            setattr(module, name, new)


def _dummy(target: str) -> Callable[..., Any]:
    def dummy(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{target} is a dummy created by the patch manager")

    return dummy
