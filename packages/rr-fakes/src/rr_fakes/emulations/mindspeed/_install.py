"""The emulated ``mindspeed`` package in ``sys.modules`` for the span of a test.

Mirrors ``mindspeed/megatron_adaptor.py`` and ``features_manager/features_manager.py`` (every
line): importing ``mindspeed.megatron_adaptor`` runs ``patch_features`` once: the MindSpeed
arguments are parsed from the command line, the features' pre-patches are registered and
applied (**before Megatron is imported**: a module that bound ``torch.compile`` earlier, such as
``megatron.core.jit.jit_fuser``, keeps the real one), then their patches are registered and
applied; targets are dotted names, imported at apply time. ``repatch(args)`` removes every
patch, sets ``args`` on the global arguments, then registers and applies the pre-patches and the
patches again: two ``apply_patches`` calls. The global arguments come from
``mindspeed.args_utils.get_full_args()``; the features from
``MindSpeedFeaturesManager.FEATURES_LIST`` (``mindspeed.features_manager.features_manager``),
read at every call. On 0.17 / 0.18 the ``mindspeed`` package imports the MegatronAdaptor
(module ``megatron_adaptor``) first: the emulation puts both in ``sys.modules`` on entry, MA
after whatever was imported before.

Unlike MindSpeed, leaving the context restores every attribute ever patched and removes the
modules, so tests can run in any order in one process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from argparse import Namespace
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from rr_fakes.emulations.mindspeed._adaptor import (
    MEGATRON_ADAPTOR,
    import_megatron_adaptor,
    remove_megatron_adaptor,
)
from rr_fakes.emulations.mindspeed._args import (
    megatron_training_args,
    parse_mindspeed_args,
    parser_unknown_args,
)
from rr_fakes.emulations.mindspeed._config import make_config_patches
from rr_fakes.emulations.mindspeed._features import (
    LINES,
    PRE_PATCH_LINES,
    Feature,
    FeaturesManager,
    Targets,
    features_for,
    new_features_manager,
    parser_for,
)
from rr_fakes.emulations.mindspeed._patches import (
    Patch,
    PatchManager,
    new_patch_manager,
    restore_everything,
)

ADAPTOR = "mindspeed.megatron_adaptor"
MEGATRON = Targets()
_MODULES = (
    "mindspeed",
    "mindspeed.patch_utils",
    "mindspeed.args_utils",
    "mindspeed.features_manager",
    "mindspeed.features_manager.features_manager",
    ADAPTOR,
)


def dotted_name(owner: type | types.ModuleType, attribute: str) -> str:
    """The dotted patch target of ``owner.attribute`` (a class or a module)."""
    if isinstance(owner, types.ModuleType):
        return f"{owner.__name__}.{attribute}"
    return f"{owner.__module__}.{owner.__qualname__}.{attribute}"


def installed_line() -> str:
    """The MindSpeed line matching the installed megatron-core (its major.minor)."""
    from importlib.metadata import version

    line = ".".join(version("megatron-core").split(".")[:2])
    if line not in LINES:
        raise ValueError(f"no MindSpeed line for megatron-core {line}; lines: {LINES}")
    return line


class EmulatedMindSpeed:
    """Handle of an installed emulation: its line, patch manager, features manager (whose
    ``FEATURES_LIST`` is ``features``), global arguments and the calls that went through a
    routing replacement (``bypass_calls``)."""

    def __init__(
        self,
        *,
        line: str,
        targets: Targets,
        args: Mapping[str, Any],
        argv: Sequence[str] | None,
        pre_patches: bool,
    ) -> None:
        self.line, self.targets, self.argv = line, targets, argv
        self.manager: type[PatchManager] = new_patch_manager()
        self.features_manager: type[FeaturesManager] = new_features_manager(self.manager)
        self.features: list[Feature] = self.features_manager.FEATURES_LIST  # the live list
        self.bypass_calls: list[str] = []
        self.adaptor_imported = False
        self.config_patches = make_config_patches(
            self.get_full_args, lambda: self.features_manager.FEATURES_LIST, line
        )
        self.features_manager.set_features_list(
            features_for(
                line, targets, self.get_full_args, self.config_patches, self.bypass_calls,
                pre_patches,
            )
        )  # fmt: skip
        self.overrides = dict(args)
        self._args: Namespace | None = None

    def get_mindspeed_args(self) -> Namespace:
        """Parsed once from ``argv`` (``None``: ``sys.argv[1:]``) with every listed feature's
        flags; ``args`` given to :func:`emulated_mindspeed` are set on top."""
        if self._args is None:
            parsed = parse_mindspeed_args(parser_for(self.features_manager), self.argv)
            for key, value in self.overrides.items():
                setattr(parsed, key, value)
            self._args = parsed
        return self._args

    @property
    def args(self) -> Namespace:
        return self.get_mindspeed_args()

    def get_full_args(self) -> Namespace:
        return megatron_training_args() or self.get_mindspeed_args()

    def apply_pre_patches(self, args: Namespace) -> None:
        self.features_manager.apply_features_pre_patches(args)

    def apply_patches(self, args: Namespace) -> None:
        with self._megatron_imports():
            self.features_manager.apply_features_patches(args)

    def _megatron_imports(self) -> AbstractContextManager[Any]:
        """Megatron's targets import under the CPU harness (megatron-core 0.18+ needs its
        triton stand-in), entered only here: after the pre-patches, as MindSpeed orders it."""
        if self.targets != MEGATRON:
            return nullcontext()
        from rr_fakes.shims.megatron import megatron_cpu

        return megatron_cpu()

    def patch_features(self) -> None:
        """What importing ``mindspeed.megatron_adaptor`` does."""
        mindspeed_args = self.get_mindspeed_args()
        self.apply_pre_patches(mindspeed_args)
        self.apply_patches(mindspeed_args)

    def repatch(self, args: Mapping[str, Any] | None = None) -> None:
        """MindSpeed's ``repatch``: remove all, set ``args``, pre-patch and patch again."""
        self.features_manager.remove_patches()
        full_args = self.get_full_args()
        for key, value in (args or {}).items():
            setattr(full_args, key, value)
        self.apply_pre_patches(full_args)
        self.apply_patches(full_args)

    def patch(self, target: str) -> Patch | None:
        """The registry's record of ``target`` (kept after removal, as in MindSpeed)."""
        return self.manager.patches_info.get(target)

    def import_adaptor(self) -> types.ModuleType:
        """``import mindspeed.megatron_adaptor`` (applies everything on first import)."""
        return importlib.import_module(ADAPTOR)


class _AdaptorLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import mindspeed.megatron_adaptor`` patch the features, as the real one does."""

    def __init__(self, handle: EmulatedMindSpeed) -> None:
        self.handle = handle

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == ADAPTOR else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.repatch = self.handle.repatch  # type: ignore[attr-defined]
        module.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
        self.handle.patch_features()
        self.handle.adaptor_imported = True


def _modules(handle: EmulatedMindSpeed) -> dict[str, types.ModuleType]:
    package = types.ModuleType("mindspeed", "Emulated MindSpeed (rr_fakes).")
    package.__path__ = []
    package.__version__ = "0.0.0+rr-fakes"  # type: ignore[attr-defined]
    package.__rr_fakes_emulation__ = True  # type: ignore[attr-defined]
    patch_utils = types.ModuleType("mindspeed.patch_utils")
    patch_utils.MindSpeedPatchesManager = handle.manager  # type: ignore[attr-defined]
    patch_utils.Patch = Patch  # type: ignore[attr-defined]
    args_utils = types.ModuleType("mindspeed.args_utils")
    args_utils.get_mindspeed_args = handle.get_mindspeed_args  # type: ignore[attr-defined]
    args_utils.get_full_args = handle.get_full_args  # type: ignore[attr-defined]
    args_utils.parser_unknown_args = parser_unknown_args  # type: ignore[attr-defined]
    manager_module = types.ModuleType("mindspeed.features_manager.features_manager")
    manager_module.MindSpeedFeaturesManager = handle.features_manager  # type: ignore[attr-defined]
    features = types.ModuleType("mindspeed.features_manager")
    features.__path__ = []
    features.MindSpeedFeature = Feature  # type: ignore[attr-defined]
    features.MindSpeedFeaturesManager = handle.features_manager  # type: ignore[attr-defined]
    features.FEATURES_LIST = []  # type: ignore[attr-defined]  # MindSpeed's static one
    features.features_manager = manager_module  # type: ignore[attr-defined]
    return {
        "mindspeed": package,
        "mindspeed.patch_utils": patch_utils,
        "mindspeed.args_utils": args_utils,
        "mindspeed.features_manager": features,
        "mindspeed.features_manager.features_manager": manager_module,
    }


@contextmanager
def emulated_mindspeed(
    *,
    line: str | None = None,
    targets: Targets = MEGATRON,
    moe_tp_extend_ep: bool = False,
    fix_router: bool = False,
    args: Mapping[str, Any] | None = None,
    argv: Sequence[str] | None = (),
    import_adaptor: bool = False,
    pre_patches: bool = True,
) -> Iterator[EmulatedMindSpeed]:
    """Install an emulated ``mindspeed`` (MindSpeed ``line``, by default the one matching the
    installed megatron-core) into ``sys.modules``; remove it fully on exit.

    ``argv`` is the command line MindSpeed parses its arguments from (``None``: ``sys.argv[1:]``,
    as MindSpeed does; the default is an empty one, since under a test runner its options would
    become global arguments). ``args`` are set on the parsed global arguments (MindSpeed merges
    them into every config); ``moe_tp_extend_ep`` also sets the ``alltoall_seq`` dispatcher
    unless ``args`` names another. ``pre_patches=False`` leaves out the pre-patches and, on 0.17
    / 0.18, the MegatronAdaptor (for a process that imported Megatron already, where they would
    come too late). With ``import_adaptor`` the adaptor is imported before the body runs.
    """
    present = [name for name in (*_MODULES, MEGATRON_ADAPTOR) if name in sys.modules]
    if present:
        raise RuntimeError(
            f"{present} already in sys.modules (a real MindSpeed or another emulation); "
            "the emulation needs a process without it"
        )
    merged: dict[str, Any] = {}
    if moe_tp_extend_ep:
        merged.update(moe_tp_extend_ep=True, moe_token_dispatcher_type="alltoall_seq")
    if fix_router:
        merged["fix_router"] = True  # on 0.16 an attribute no feature reads
    merged.update(args or {})
    handle = EmulatedMindSpeed(
        line=line or installed_line(),
        targets=targets,
        args=merged,
        argv=argv,
        pre_patches=pre_patches,
    )
    loader = _AdaptorLoader(handle)
    sys.modules.update(_modules(handle))
    if pre_patches and handle.line not in PRE_PATCH_LINES:
        import_megatron_adaptor()  # mindspeed/__init__.py: import megatron_adaptor
    sys.meta_path.insert(0, loader)
    try:
        if import_adaptor:
            handle.import_adaptor()
        yield handle
    finally:
        sys.meta_path.remove(loader)
        remove_megatron_adaptor()
        restore_everything(handle.manager)
        for name in _MODULES:
            sys.modules.pop(name, None)
