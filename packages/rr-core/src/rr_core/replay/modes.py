"""The modes an attached router runs in.

The checks on what callers pass the controller moved to :mod:`rr_core.replay.checks`; their old
names here still work for one release, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import enum

from rr_core.errors import ReplayError
from rr_core.replay.moved import moved_names


class ReplayMode(enum.Enum):
    """What an attached router does at its top-k step."""

    OFF = "off"  # native routing
    RECORD = "record"  # native routing, ids stored per micro-batch
    REPLAY = "replay"  # armed ids on valid rows, native routing on the others


_MODES = {mode.value: mode for mode in ReplayMode}


def as_mode(mode: object) -> ReplayMode:
    """``mode`` as a :class:`ReplayMode`: a member, or exactly a member's value (``"off"``,
    ``"record"``, ``"replay"``). Anything else raises: a mode that is not understood must never
    fall through to one of the others."""
    if isinstance(mode, ReplayMode):
        return mode
    if isinstance(mode, str) and mode in _MODES:
        return _MODES[mode]
    accepted = ", ".join(f"ReplayMode.{m.name} ({m.value!r})" for m in ReplayMode)
    raise ReplayError(f"mode must be one of {accepted}; got {mode!r} ({type(mode).__name__})")


__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        ("ID_DTYPES", "check_hashable", "check_routes", "layer_numbers_of", "unchecked_ids_error"),
        "rr_core.replay.checks",
    ),
)
