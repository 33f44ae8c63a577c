"""A registry of the attributes rr sets on objects it does not own (modules, classes, managers).

Each entry remembers what it replaced (or that the attribute was absent from the owner's own
namespace). :meth:`Patches.restore` undoes them last first, and only where rr's value is still
the one in place: whoever patched over rr since keeps their patch, and nothing rr did not set
is ever touched. Wrapping a callable (so that ``inspect.signature`` and un-patching can tell it
apart) is wrapt's job; this records where the wrapper went.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_ABSENT = object()


@dataclass(frozen=True)
class _Entry:
    owner: Any
    attribute: str
    original: Any  # the owner's own value before, or _ABSENT
    value: Any

    def in_place(self) -> bool:
        return vars(self.owner).get(self.attribute, _ABSENT) is self.value


class Patches:
    """Attributes set through :meth:`set`, restored by :meth:`restore`. Not thread-safe: callers
    that patch from several threads hold their own lock."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def set(self, owner: Any, attribute: str, value: Any) -> None:
        """``setattr(owner, attribute, value)``, remembering the owner's own previous value."""
        original = vars(owner).get(attribute, _ABSENT)
        setattr(owner, attribute, value)
        self._entries.append(_Entry(owner, attribute, original, value))

    def restore(self, *, force: bool = False) -> int:
        """Put back every original where rr's value is still in place, last first; returns how
        many were put back. The registry is empty afterwards. ``force`` puts originals back
        even where the value changed since (a test harness putting the process back as it was)."""
        restored = 0
        while self._entries:
            entry = self._entries.pop()
            if not (force or entry.in_place()):
                continue  # patched over since: leave theirs
            if entry.original is _ABSENT:
                if entry.attribute in vars(entry.owner):  # (forced: it may be gone already)
                    delattr(entry.owner, entry.attribute)
            else:
                setattr(entry.owner, entry.attribute, entry.original)
            restored += 1
        return restored

    def in_place(self) -> bool:
        """Whether something is patched and every patch is still rr's value."""
        return bool(self._entries) and all(entry.in_place() for entry in self._entries)

    def holds(self, owner: Any, attribute: str) -> bool:
        """Whether ``owner.attribute`` was set through this registry (and not restored)."""
        return any(e.owner is owner and e.attribute == attribute for e in self._entries)

    def __iter__(self) -> Iterator[tuple[Any, str]]:
        """(owner, attribute) of each patch, first set first."""
        return iter([(e.owner, e.attribute) for e in self._entries])

    def __len__(self) -> int:
        return len(self._entries)
