"""The failure catalogue: the ways routing replay is known to go wrong, one entry per code.

Error messages cite these codes and point to ``rr explain CODE``, which prints the entry. The
package is plain data (no torch, no other rr module) so that ``rr explain`` answers instantly and
on a machine where torch does not import.

Codes by letter: A addressing the wrong routers, B backward / recompute / lifecycle, C trainer-side
semantics, D aligning routes to tokens, E capture-side failures, F memory and speed, G seen in
the field. The entries live in one module per family; this module is the one front door.
"""

from __future__ import annotations

import textwrap

from rr_core.failures import alignment, capture, field, routers, speed
from rr_core.failures.mode import GROUPS, FailureMode

__all__ = ["FAILURE_MODES", "GROUPS", "FailureMode", "failure_mode", "render"]

_ENTRIES = (*routers.ENTRIES, *alignment.ENTRIES, *capture.ENTRIES, *speed.ENTRIES, *field.ENTRIES)

#: Every catalogue entry by code, in catalogue order.
FAILURE_MODES: dict[str, FailureMode] = {entry.code: entry for entry in _ENTRIES}


def failure_mode(code: str) -> FailureMode | None:
    """The entry for ``code`` (case and surrounding spaces ignored), or None."""
    return FAILURE_MODES.get(code.strip().upper()) if isinstance(code, str) else None


def render(entry: FailureMode, width: int = 96) -> str:
    """An entry as ``rr explain CODE`` prints it, wrapped to ``width`` columns."""
    head = f"{entry.code}: {entry.title} ({GROUPS[entry.code[0]]})\n\n"
    fields = (
        ("Symptom:", entry.symptom),
        ("Cause:", entry.cause),
        ("What rr does:", entry.handling),
    )
    body = [
        textwrap.fill(
            text,
            width,
            initial_indent=f"{label:<14}",
            subsequent_indent=" " * 14,
            break_on_hyphens=False,
        )
        for label, text in fields
    ]
    return head + "\n".join(body) + "\n"
