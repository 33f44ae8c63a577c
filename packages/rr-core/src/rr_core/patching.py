"""How rr changes objects it does not own (modules, classes, patch managers): one registry, one
wrapper, one lock and one policy toward whoever patches after rr.

- :class:`RRWrapper` is rr's proxy around a foreign callable (wrapt, so ``inspect.signature``
  sees the original). It can be *disabled in place*: it then calls what it wraps unchanged.
- :class:`Patches` records every attribute set through it with what it replaced (or that the
  attribute was absent from the owner's own namespace). :meth:`Patches.restore` undoes them last
  first. The policy toward a foreign patch laid over rr's: **rr never undoes it**. Where rr's
  value is still on top, the original goes back; where another library wrapped over rr's
  wrapper (it is still reachable along ``__wrapped__``), rr's wrapper is disabled in place and
  an :class:`~rr_core.RRWarning` says so; a plain value replaced since is left as it is.
- :meth:`Patches.set_copies` covers a function other modules copied by name
  (``from module import f``): every loaded module holding it gets rr's value, recorded like
  any other patch; :meth:`Patches.restore_copies` puts the original back in modules that copied
  rr's value after it was set (no patch recorded those).
- :data:`PATCH_LOCK` guards all of it: adapters take it for install and uninstall, so one lock
  orders every change rr makes to foreign state.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import wrapt

from rr_core.errors import RRWarning

#: The one lock behind every change rr makes to objects it does not own (re-entrant: an
#: adapter's install may call another adapter's).
PATCH_LOCK = threading.RLock()

_ABSENT = object()
_MAX_CHAIN = 32  # proxies over proxies deeper than this are not followed (a cycle guard)

#: ``wrapper(wrapped, instance, args, kwargs)``, wrapt's wrapper signature.
Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


_FunctionWrapper: Any = wrapt.FunctionWrapper  # generic in some wrapt releases' stubs only


class RRWrapper(_FunctionWrapper):  # type: ignore[misc]
    """rr's proxy around one foreign callable. ``wrapper`` runs while the proxy is active; a
    disabled proxy calls the wrapped callable unchanged (the state is shared with the bound
    proxies wrapt makes when the attribute is read from an instance)."""

    def __init__(self, wrapped: Any, wrapper: Wrapper, *, name: str = "") -> None:
        super().__init__(wrapped, self._dispatch)
        self._self_rr_wrapper = wrapper
        self._self_rr_active = True
        self._self_rr_name = name or getattr(wrapped, "__qualname__", repr(wrapped))

    def _dispatch(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        parent = getattr(self, "_self_parent", None) or self
        if not parent._self_rr_active:
            return wrapped(*args, **kwargs)
        return parent._self_rr_wrapper(wrapped, instance, args, kwargs)

    @property
    def rr_active(self) -> bool:
        return bool(self._self_rr_active)

    @property
    def rr_name(self) -> str:
        return str(self._self_rr_name)

    def rr_disable(self) -> None:
        """Pass every call through from now on (rr's hook is off, the proxy stays where it is)."""
        self._self_rr_active = False


def wrapper_chain(value: Any) -> list[Any]:
    """``value`` and everything under it along ``__wrapped__`` (rr's and others' proxies)."""
    seen: list[Any] = []
    while value is not None and not any(value is s for s in seen) and len(seen) < _MAX_CHAIN:
        seen.append(value)
        value = getattr(value, "__wrapped__", None)
    return seen


def as_rr_wrapper(item: Any) -> RRWrapper | None:
    """``item`` itself, or the proxy it is bound from (a library that reads a method from the
    class before wrapping it holds wrapt's bound proxy), when that is an :class:`RRWrapper`."""
    for candidate in (item, getattr(item, "_self_parent", None)):
        if isinstance(candidate, RRWrapper):
            return candidate
    return None


def active_rr_wrapper(value: Any, kind: type[RRWrapper] = RRWrapper) -> RRWrapper | None:
    """The first active ``kind`` proxy reachable from ``value`` along ``__wrapped__``."""
    for item in wrapper_chain(value):
        proxy = as_rr_wrapper(item)
        if isinstance(proxy, kind) and proxy.rr_active:
            return proxy
    return None


def raw_attribute(owner: Any, attribute: str) -> Any:
    """The attribute as stored: a class's plain function rather than a bound method, found
    along the MRO; a module's or instance's value otherwise."""
    for klass in getattr(owner, "__mro__", (owner,)):
        if attribute in vars(klass):
            return vars(klass)[attribute]
    return getattr(owner, attribute)


@dataclass(frozen=True)
class _Entry:
    owner: Any
    attribute: str
    original: Any  # the owner's own value before, or _ABSENT
    value: Any

    def current(self) -> Any:
        return vars(self.owner).get(self.attribute, _ABSENT)

    def in_place(self) -> bool:
        return self.current() is self.value

    def buried(self) -> bool:
        """rr's wrapper is under someone else's, still reachable (so still called)."""
        return isinstance(self.value, RRWrapper) and any(
            as_rr_wrapper(item) is self.value for item in wrapper_chain(self.current())
        )


class Patches:
    """Attributes set through :meth:`set` or :meth:`wrap`, taken out by :meth:`restore`.
    Callers hold :data:`PATCH_LOCK` around changes made from several threads."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def set(self, owner: Any, attribute: str, value: Any) -> None:
        """``setattr(owner, attribute, value)``, remembering the owner's own previous value."""
        original = vars(owner).get(attribute, _ABSENT)
        setattr(owner, attribute, value)
        self._entries.append(_Entry(owner, attribute, original, value))

    def wrap(
        self,
        owner: Any,
        attribute: str,
        wrapper: Wrapper,
        *,
        kind: type[RRWrapper] = RRWrapper,
        name: str = "",
    ) -> RRWrapper:
        """Wrap what ``owner.attribute`` holds now in a ``kind`` proxy and set it (unless an
        active ``kind`` proxy is already reachable there: then that one is returned)."""
        current = raw_attribute(owner, attribute)
        existing = active_rr_wrapper(current, kind)
        if existing is not None:
            return existing
        self._forget_dropped(owner, attribute)
        proxy = kind(current, wrapper, name=name or f"{_name_of(owner)}.{attribute}")
        self.set(owner, attribute, proxy)
        return proxy

    def set_copies(
        self,
        original: Any,
        value: Any,
        attribute: str,
        *,
        within: Callable[[str], bool] | None = None,
    ) -> int:
        """Set ``value`` as ``attribute`` wherever a loaded module holds ``original`` under that
        name: its own module and each ``from module import attribute`` copy in ``sys.modules``
        (``within(module_name)`` narrows the search). A copy holding an rr proxy over
        ``original`` that an earlier uninstall left passing through is replaced too (it would
        never call rr again); a copy holding anything else, another library's wrapper
        included, is left. Each replacement is recorded, so :meth:`restore` puts the copies
        back. Returns how many modules now hold ``value``."""
        replaced = 0
        for module_name, module in list(sys.modules.items()):
            own = getattr(module, "__dict__", None)
            if not isinstance(own, dict) or (within is not None and not within(module_name)):
                continue
            held = own.get(attribute, _ABSENT)
            if held is value:
                replaced += 1
            elif held is original or _passes_through_to(held, original):
                self.set(module, attribute, value)
                replaced += 1
        return replaced

    def restore_copies(
        self,
        value: Any,
        original: Any,
        attribute: str,
        *,
        within: Callable[[str], bool] | None = None,
    ) -> int:
        """Put ``original`` back as ``attribute`` wherever a loaded module copied rr's ``value``
        by name after rr set it (``from module import attribute`` while installed: no patch
        recorded it, so :meth:`restore` cannot); ``within(module_name)`` narrows the search.
        Returns how many modules got ``original`` back."""
        recorded = {(id(e.owner), e.attribute) for e in self._entries}
        restored = 0
        for module_name, module in list(sys.modules.items()):
            own = getattr(module, "__dict__", None)
            if not isinstance(own, dict) or (within is not None and not within(module_name)):
                continue
            if own.get(attribute, _ABSENT) is value and (id(module), attribute) not in recorded:
                setattr(module, attribute, original)
                restored += 1
        return restored

    def _forget_dropped(self, owner: Any, attribute: str) -> None:
        """Drop the entries of ``owner.attribute`` whose value another library replaced (rr's
        wrapper no longer reachable): their wrappers are disabled, and what is there now is
        what a new patch replaces (and what uninstall puts back)."""
        for entry in [e for e in self._entries if e.owner is owner and e.attribute == attribute]:
            if not (entry.in_place() or entry.buried()):
                if isinstance(entry.value, RRWrapper):
                    entry.value.rr_disable()
                self._entries.remove(entry)

    def restore(self, *, force: bool = False) -> int:
        """Take out every patch, last first, by the policy in the module doc; returns how many
        were put back or disabled. The registry is empty afterwards. ``force`` puts originals
        back even over later changes (a test harness putting the process back as it was)."""
        undone, wrappers = 0, []
        while self._entries:
            entry = self._entries.pop()
            wrapper = entry.value if isinstance(entry.value, RRWrapper) else None
            if wrapper is not None and not wrapper.rr_active:
                continue  # disabled before this call: nothing of rr's runs there
            if force or entry.in_place():
                _put_back(entry)
            elif entry.buried():
                warnings.warn(
                    f"{entry.value.rr_name} was wrapped again by another library after rr; "
                    "rr's hook is disabled in place so that library's patch stays intact",
                    RRWarning,
                    stacklevel=2,
                )
            elif wrapper is None:
                continue  # a plain value replaced since: theirs stays, nothing of rr's is left
            if wrapper is not None:
                wrappers.append(wrapper)  # disabled last: one wrapper may sit in several places
            undone += 1
        for wrapper in wrappers:
            wrapper.rr_disable()
        return undone

    def in_place(self) -> bool:
        """Whether something is patched and every patch is still rr's value on top."""
        return bool(self._entries) and all(entry.in_place() for entry in self._entries)

    def live(self) -> list[tuple[Any, str]]:
        """(owner, attribute) of each patch through which rr still acts: on top, or an active
        wrapper buried under someone else's."""
        return [
            (e.owner, e.attribute)
            for e in self._entries
            if (e.in_place() or e.buried())
            and not (isinstance(e.value, RRWrapper) and not e.value.rr_active)
        ]

    def wrappers(self) -> list[RRWrapper]:
        """The distinct active rr wrappers set through this registry (one may sit in several
        places: every module holding a ``from x import op`` copy)."""
        found: list[RRWrapper] = []
        for entry in self._entries:
            value = entry.value
            if (
                isinstance(value, RRWrapper)
                and value.rr_active
                and all(value is not f for f in found)
            ):
                found.append(value)
        return found

    def holds(self, owner: Any, attribute: str) -> bool:
        """Whether ``owner.attribute`` was set through this registry (and not restored)."""
        return any(e.owner is owner and e.attribute == attribute for e in self._entries)

    def __iter__(self) -> Iterator[tuple[Any, str]]:
        """(owner, attribute) of each patch, first set first."""
        return iter([(e.owner, e.attribute) for e in self._entries])

    def __len__(self) -> int:
        return len(self._entries)


def _passes_through_to(held: Any, original: Any) -> bool:
    """``held`` is a chain of disabled rr proxies ending at ``original``."""
    chain = wrapper_chain(held)
    proxies = [as_rr_wrapper(item) for item in chain[:-1]]
    return (
        len(chain) > 1
        and chain[-1] is original
        and all(p is not None and not p.rr_active for p in proxies)
    )


def _put_back(entry: _Entry) -> None:
    if entry.original is _ABSENT:
        if entry.attribute in vars(entry.owner):  # (forced: it may be gone already)
            delattr(entry.owner, entry.attribute)
    else:
        setattr(entry.owner, entry.attribute, entry.original)


def _name_of(owner: Any) -> str:
    return str(getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner)))
