"""MindSpeed's patch registry, with the record shape and semantics of ``mindspeed/patch_utils.py``
(read on branches 26.1.0_core_r0.12.1, core_r0.16.0, core_r0.17.0, core_r0.18.0: identical but
for blank lines).

- One :class:`Patch` per dotted target, kept in ``patches_info`` for the life of the process.
  ``orig_module_name`` / ``orig_func_name`` are the target split at its last dot (both strings);
  ``patch_func`` is the replacement (None when only wrappers are registered); ``wrappers`` lists
  the functions whose ``__name__`` ends in ``wrapper`` / ``decorator``, applied in order over
  ``patch_func or orig_func``; ``final_patch_func`` is what was set.
- ``register_patch(name)`` without a function registers a dummy replacement that raises.
- ``orig_func_id`` / ``patch_func_id`` are properties: ``id()`` of the current ``orig_func`` /
  ``patch_func`` (so ``id(None)`` once removed), not ids kept from registration.
- ``apply_patch`` does nothing when ``is_applied``; the first apply remembers ``orig_module`` /
  ``orig_func`` for good. It sets the result on the owner and on every module in
  ``sys.modules`` whose attribute of that name *is* the current object.
- ``remove_patch`` puts ``orig_func`` back on every module, and on the class of that name that
  a module holds, where the attribute *is* ``final_patch_func``, skipping modules whose name
  contains ``mindspeed``; then ``patch_func`` and ``final_patch_func`` become None. The entry
  stays in ``patches_info``; ``remove_patches`` also clears its wrappers.
- Both sweeps read modules with ``hasattr`` / ``getattr``, so a module-level ``__getattr__``
  runs for the patched name on every module in ``sys.modules`` (lazy modules, rr's own among
  them, import what they re-export under that name; an ImportError raised there ends
  ``apply_patches``), and a lazily re-exported copy is replaced like a plain one. A class
  attribute is compared as ``getattr`` returns it: a ``classmethod`` reads as a new bound method
  each time, so ``remove_patch`` never puts back a replaced ``__init_subclass__``.

The manager is a class whose methods are called on the class, over a class-level dict, as in
MindSpeed; :func:`new_patch_manager` makes a fresh one per emulation.
:func:`restore_everything` is the emulation's own cleanup (MindSpeed has none).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any, ClassVar

_STACKING_SUFFIXES = ("wrapper", "decorator")
_ABSENT = object()
_DUMMY_FILE = "mindspeed.dummy_module.py"


def _own(module: Any, name: str) -> Any:
    """A module's own attribute (its ``__dict__``: where ``from x import f`` copies live),
    without running a module-level ``__getattr__``."""
    try:
        return vars(module).get(name, _ABSENT)
    except TypeError:
        return _ABSENT


def is_stacking(func: Any) -> bool:
    """Does MindSpeed stack ``func`` as a decorator (its ``__name__`` ends in wrapper /
    decorator)?"""
    return str(getattr(func, "__name__", "")).endswith(_STACKING_SUFFIXES)


def dummy_function(name: str) -> Callable[..., Any]:
    def dummy_function(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"function {name} no exist")

    return dummy_function


def _dummy_module(path: str) -> types.ModuleType:
    module = types.ModuleType(path)
    module.__file__ = _DUMMY_FILE
    module.__spec__ = ModuleSpec(path, None)
    sys.modules[path] = module
    return module


def parse_path(module_path: str, attribute: str | None, create_dummy: bool) -> tuple[Any, Any]:
    """``(owner, current value)``: import each prefix of ``module_path``; the first part that is
    not a module is looked up as an attribute (a class). A missing module attribute is set to
    None (MindSpeed's behaviour, so a patch on a name Megatron removed lands on nothing)."""
    parts = module_path.split(".")
    for i in range(1, len(parts) + 1):
        parent, path = ".".join(parts[: i - 1]), ".".join(parts[:i])
        try:
            importlib.import_module(path)
        except ModuleNotFoundError:
            holder = importlib.import_module(parent) if parent else None
            if holder is None or not hasattr(holder, parts[i - 1]):
                if not create_dummy:
                    raise
                setattr(holder, parts[i - 1], _dummy_module(path)) if holder else _dummy_module(
                    path
                )
                continue
            owner = getattr(holder, parts[i - 1])
            if attribute is not None and hasattr(owner, attribute):
                return owner, getattr(owner, attribute)
            if create_dummy:
                return owner, dummy_function(str(attribute))
            raise RuntimeError(f"no exist {attribute} of {owner}") from None
    module = sys.modules[module_path]
    if attribute is not None and not hasattr(module, attribute):
        _ORIGINALS.setdefault((id(module), attribute), (module, attribute, _ABSENT))
        setattr(module, attribute, None)
    return module, None if attribute is None else getattr(module, attribute)


class Patch:
    """One registered target (see the module doc for each field)."""

    def __init__(self, orig_func_name: str, new_func: Any, create_dummy: bool) -> None:
        module_name, dot, attribute = orig_func_name.rpartition(".")
        self.orig_module_name = module_name if dot else orig_func_name
        self.orig_func_name: str | None = attribute if dot else None
        self.orig_module: Any = None
        self.orig_func: Any = None
        self.patch_func: Any = None
        self.final_patch_func: Any = None
        self.wrappers: list[Any] = []
        self.set_patch_func(dummy_function(orig_func_name) if new_func is None else new_func)
        self.is_applied = False
        self.create_dummy = create_dummy

    def set_patch_func(self, new_func: Any, force_patch: bool = False) -> None:
        if is_stacking(new_func):
            if new_func not in self.wrappers:
                self.wrappers.append(new_func)
        else:
            if self.patch_func is not None and not force_patch:
                raise RuntimeError(f"the patch of {self.orig_func_name} exist !")
            self.patch_func = new_func
        self.is_applied = False

    def remove_wrappers(self, names: str | list[str] | None = None) -> None:
        if names is None:
            self.wrappers.clear()
            return
        wanted = {names} if isinstance(names, str) else set(names)
        self.wrappers[:] = [w for w in self.wrappers if w.__name__ not in wanted]

    def apply_patch(self) -> None:
        if self.is_applied:
            return
        module, current = parse_path(self.orig_module_name, self.orig_func_name, self.create_dummy)
        if self.orig_module is None:
            self.orig_module, self.orig_func = module, current
            _remember(module, self.orig_func_name)
        final = self.orig_func if self.patch_func is None else self.patch_func
        for wrapper in self.wrappers:
            final = wrapper(final)
        name = self.orig_func_name
        if name is not None:
            setattr(self.orig_module, name, final)
        for holder in list(sys.modules.copy().values()):
            if (
                name is not None
                and hasattr(holder, name)
                and id(getattr(holder, name)) == id(current)
            ):
                _remember(holder, name)
                setattr(holder, name, final)
        self.is_applied = True
        self.final_patch_func = final

    @property
    def orig_func_id(self) -> int:
        return id(self.orig_func)

    @property
    def patch_func_id(self) -> int:
        return id(self.patch_func)

    def remove_patch(self) -> None:
        class_name = self.orig_module_name.split(".")[-1]
        name = self.orig_func_name
        for key, holder in list(sys.modules.copy().items()):
            if "mindspeed" in key or key == "torch.classes":
                continue
            if inspect.isclass(self.orig_module) and hasattr(holder, class_name):
                holder = getattr(holder, class_name)  # the class of that name this module holds
            if (
                name is not None
                and hasattr(holder, name)
                and id(getattr(holder, name)) == id(self.final_patch_func)
            ):
                setattr(holder, name, self.orig_func)
        self.patch_func = None
        self.final_patch_func = None
        self.is_applied = False


class PatchManager:
    """``MindSpeedPatchesManager``: class-level ``patches_info`` and methods called on the class
    (MindSpeed's are static methods over its one class; here each emulation gets a subclass
    with its own dict, see :func:`new_patch_manager`)."""

    patches_info: ClassVar[dict[str, Patch]] = {}

    @classmethod
    def register_patch(
        cls,
        orig_func_name: str,
        new_func: Any = None,
        force_patch: bool = False,
        create_dummy: bool = False,
    ) -> None:
        if orig_func_name not in cls.patches_info:
            cls.patches_info[orig_func_name] = Patch(orig_func_name, new_func, create_dummy)
        else:
            cls.patches_info[orig_func_name].set_patch_func(new_func, force_patch)

    @classmethod
    def remove_wrappers(
        cls, orig_func_name: str, wrappers_name: Any, remove_check: bool = True
    ) -> None:
        patch = cls.patches_info.get(orig_func_name)
        if patch is None:
            raise ValueError(f"The function <{orig_func_name}> not exist.")
        before = len(patch.wrappers)
        patch.remove_wrappers(wrappers_name)
        if remove_check and before == len(patch.wrappers):
            raise RuntimeError("Remove wrappers has not remove anything.")

    @classmethod
    def remove_patches(cls) -> None:
        for patch in cls.patches_info.values():
            patch.remove_patch()
            patch.remove_wrappers()

    @classmethod
    def apply_patches(cls) -> None:
        for patch in cls.patches_info.values():
            patch.apply_patch()


def new_patch_manager() -> type[PatchManager]:
    """A fresh ``MindSpeedPatchesManager`` with its own empty ``patches_info``."""
    return type("MindSpeedPatchesManager", (PatchManager,), {"patches_info": {}})


# -- the emulation's own cleanup -----------------------------------------------------------------
_ORIGINALS: dict[tuple[int, str], tuple[Any, str, Any]] = {}


def _remember(owner: Any, name: str | None) -> None:
    """Record ``owner``'s own value of ``name`` before the first patch (for the cleanup)."""
    if name is not None and (id(owner), name) not in _ORIGINALS:
        own = vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
        _ORIGINALS[(id(owner), name)] = (owner, name, own)


def restore_everything(manager: type[PatchManager]) -> None:
    """Put back every attribute the emulation's patches ever changed (class attributes and
    ``from x import`` copies too), drop its dummy modules and forget every record."""
    for patch in manager.patches_info.values():
        if patch.orig_func_name is None or patch.orig_module is None:
            continue
        for holder in list(sys.modules.values()):
            held = _own(holder, patch.orig_func_name)
            if (
                held is patch.final_patch_func
                and held is not None
                and holder is not patch.orig_module
            ):
                setattr(holder, patch.orig_func_name, patch.orig_func)
    for owner, name, own in _ORIGINALS.values():
        if own is _ABSENT:
            if name in getattr(owner, "__dict__", {}):
                delattr(owner, name)
        else:
            setattr(owner, name, own)
    _ORIGINALS.clear()
    dummies = [k for k, m in sys.modules.items() if _own(m, "__file__") == _DUMMY_FILE]
    for key in dummies:
        del sys.modules[key]
    manager.patches_info.clear()
