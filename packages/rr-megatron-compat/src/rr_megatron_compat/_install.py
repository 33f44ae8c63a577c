"""``install()`` / ``uninstall()``: the router hooks, patched through recognisable wrapt proxies.

Idempotent by identity, not by a flag: ``install()`` looks at what each attribute holds *now*.
If it is rr's proxy (or a chain of ``__wrapped__`` proxies that contains rr's), nothing is
done; if another library replaced it since (MindSpeed's ``repatch()`` drops patches installed
in between), rr wraps whatever is there again. ``uninstall()`` restores the original where rr's
proxy is still on top, and disables its proxy where another library wrapped over it (so no
foreign patch is ever undone). ``install()`` wraps what
:func:`~rr_megatron_compat._versions.hook_specs` names for the installed line and records each
proxy; ``uninstall()`` walks that record, so it needs no version lookup.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import wrapt

from rr_core import ReplayError, RRWarning
from rr_megatron_compat._checks import check_flag
from rr_megatron_compat._versions import (
    HookSpec,
    MegatronLine,
    check_supported,
    hook_specs,
    megatron_line,
)


class RRProxy(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """rr's wrapper around one Megatron attribute; ``inspect.signature`` sees the original."""

    def __init__(self, wrapped: Any, wrapper: Any, spec: HookSpec) -> None:
        super().__init__(wrapped, self._dispatch)
        self._self_rr_spec = spec
        self._self_rr_wrapper = wrapper
        self._self_rr_active = True

    def _dispatch(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        # wrapt binds methods through a bound proxy that shares this parent's state
        parent = getattr(self, "_self_parent", None) or self
        if not parent._self_rr_active:
            return wrapped(*args, **kwargs)
        return parent._self_rr_wrapper(wrapped, instance, args, kwargs)


@dataclass
class _Installed:
    spec: HookSpec
    owner: Any
    original: Any
    proxy: RRProxy


_LOCK = threading.RLock()
_INSTALLED: list[_Installed] = []


def _owner(spec: HookSpec) -> Any:
    module = importlib.import_module(spec.module)
    return module if spec.owner is None else getattr(module, spec.owner)


def _chain(value: Any) -> list[Any]:
    """``value`` and everything under it along ``__wrapped__`` (rr's and others' proxies)."""
    seen: list[Any] = []
    while value is not None and not any(value is s for s in seen) and len(seen) < 32:
        seen.append(value)
        value = getattr(value, "__wrapped__", None)
    return seen


def _as_rr_proxy(item: Any) -> RRProxy | None:
    """``item`` itself, or the proxy it is bound from: a library that reads the attribute from
    the class before wrapping it (MindSpeed's patch manager) holds wrapt's bound wrapper."""
    for candidate in (item, getattr(item, "_self_parent", None)):
        if isinstance(candidate, RRProxy):
            return candidate
    return None


def _rr_proxy_in(value: Any) -> RRProxy | None:
    for item in _chain(value):
        proxy = _as_rr_proxy(item)
        if proxy is not None and proxy._self_rr_active:
            return proxy
    return None


def _current(owner: Any, attribute: str) -> Any:
    # the raw attribute (a plain function on a class, not a bound method)
    for klass in getattr(owner, "__mro__", (owner,)):
        if attribute in vars(klass):
            return vars(klass)[attribute]
    return getattr(owner, attribute)


def install(*, force: bool = False) -> tuple[str, ...]:
    """Install rr's router hooks for the installed megatron-core; returns the hooked names.

    Raises :class:`UnsupportedMegatronError` naming the version when it is outside the
    supported range, unless ``force``. Safe to call again at any time (see module doc).
    Import this after any library that patches Megatron's router at import (MindSpeed), or
    call it again after such a library re-patched.
    """
    check_flag(force, "install(force=...)", ReplayError)
    line = megatron_line()
    check_supported(line, force=force)
    from rr_megatron_compat._hooks import WRAPPERS

    with _LOCK:
        # resolve every target first, so a missing one patches nothing
        targets = [(spec, _owner(spec)) for spec in hook_specs(line)]
        for spec, owner in targets:
            current = _current(owner, spec.attribute)
            if _rr_proxy_in(current) is not None:
                continue
            proxy = RRProxy(current, WRAPPERS[spec.role], spec)
            setattr(owner, spec.attribute, proxy)
            _INSTALLED.append(_Installed(spec, owner, current, proxy))
        return tuple(spec.name for spec, _ in targets)


def uninstall() -> int:
    """Remove rr's hooks; returns how many proxies were taken out or disabled. Idempotent."""
    removed = 0
    with _LOCK:
        while _INSTALLED:
            entry = _INSTALLED.pop()
            if not entry.proxy._self_rr_active:
                continue
            current = _current(entry.owner, entry.spec.attribute)
            if current is entry.proxy:
                setattr(entry.owner, entry.spec.attribute, entry.original)
            elif any(item is entry.proxy for item in _chain(current)):
                warnings.warn(
                    f"{entry.spec.name} was wrapped again by another library after rr; rr's "
                    "hook is disabled in place so that library's patch stays intact",
                    RRWarning,
                    stacklevel=2,
                )
            entry.proxy._self_rr_active = False
            removed += 1
    return removed


def installed_hooks() -> tuple[str, ...]:
    """Names of the attributes where an active rr proxy is reachable right now."""
    with _LOCK:
        return tuple(
            e.spec.name
            for e in _INSTALLED
            if e.proxy._self_rr_active
            and any(
                _as_rr_proxy(item) is e.proxy
                for item in _chain(_current(e.owner, e.spec.attribute))
            )
        )


def is_installed() -> bool:
    """True when every hook of the installed line is in place and active."""
    try:
        line: MegatronLine = megatron_line()
    except ImportError:
        return False
    wanted = {spec.name for spec in hook_specs(line)}
    return bool(wanted) and wanted <= set(installed_hooks())
