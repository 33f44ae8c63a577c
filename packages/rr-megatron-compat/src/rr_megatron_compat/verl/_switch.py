"""The one switch for every verl side rr supports: ``rr_megatron_compat.verl.install()``.

A side is an installer of the package whose hooks it builds on, found through the ``rr.verl``
entry-point group (so this package imports none of them): verl's Megatron engine here, its FSDP
engine in rr-transformers, its rollout (agent loop and trainer padding) in rr-vllm. Each names
the verl modules it patches (``verl_modules``).

``install()`` checks verl's release once (:mod:`rr_core.verl_release`) and installs each side
present when a process imports one of its verl modules, through a post-import hook, or at once
where the process already has. It imports no verl module itself: as Ray's
``worker_process_setup_hook`` it runs in every worker verl starts, and a worker that never
imports a side's module (a vLLM server, a reward worker) pays for that side nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt

from rr_core.adapters import Installer
from rr_core.verl_release import check_verl_release

#: The entry-point group each package's verl side is registered in.
GROUP = "rr.verl"


@dataclass(frozen=True)
class Side:
    """One verl side: its installer and the verl modules whose import installs it."""

    name: str
    installer: Installer

    @property
    def verl_modules(self) -> tuple[str, ...]:
        return tuple(getattr(self.installer, "verl_modules", ()))


@dataclass
class _Switch:
    on: bool = False
    force: bool = False
    #: verl modules whose post-import hook is registered (wrapt keeps hooks for the process:
    #: each is registered once and acts only while the switch is on)
    hooked: set[str] | None = None


_STATE = _Switch(hooked=set())
_LOCK = threading.RLock()


@functools.cache
def sides() -> dict[str, Side]:
    """The verl sides installed packages provide, by name (``megatron``, ``fsdp``,
    ``rollout``); the Megatron side is this package's own, registered or not. Read once a
    process."""
    from rr_megatron_compat.verl._install import ADAPTER

    found = {"megatron": Side("megatron", ADAPTER)}
    for entry in importlib.metadata.entry_points(group=GROUP):
        if entry.name not in found:
            found[entry.name] = Side(entry.name, entry.load())
    return found


def _imported(side: Side) -> bool:
    return any(name in sys.modules for name in side.verl_modules)


def _installer_on_import(side: Side) -> Callable[[Any], None]:
    def on_import(_module: Any) -> None:
        with _LOCK:
            if _STATE.on and not side.installer.is_installed():
                side.installer.install(force=_STATE.force)

    return on_import


def install(*, force: bool = False) -> tuple[str, ...]:
    """Switch every verl side present to rr: now where this process has imported the side's
    verl module, else when it does. ``force=True`` hooks a verl outside the tested range.
    Idempotent; returns what the sides installed now patched. Usable as Ray's
    ``worker_process_setup_hook`` (``rr_megatron_compat.verl.install``)."""
    check_verl_release("rr_megatron_compat.verl.install()", force=force)
    with _LOCK:
        _STATE.on, _STATE.force = True, force
        patched: list[str] = []
        for side in sides().values():
            if _imported(side):
                patched += side.installer.install(force=force)
            for name in side.verl_modules:
                assert _STATE.hooked is not None
                if name not in _STATE.hooked:
                    _STATE.hooked.add(name)
                    wrapt.register_post_import_hook(_installer_on_import(side), name)
        return tuple(patched)


def uninstall() -> int:
    """Every side back to verl's own code, and no side installed on a later import.
    Idempotent; returns how many patches were taken out."""
    with _LOCK:
        _STATE.on = False
        return sum(side.installer.uninstall() for side in sides().values())


def is_installed() -> bool:
    """The switch is on and every side whose verl module this process imported is in place."""
    with _LOCK:
        return _STATE.on and all(
            side.installer.is_installed() for side in sides().values() if _imported(side)
        )
