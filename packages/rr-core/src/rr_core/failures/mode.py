"""The shape of a catalogue entry and the catalogue's groups (one letter each)."""

from __future__ import annotations

from typing import NamedTuple


class FailureMode(NamedTuple):
    """One catalogue entry: what a user sees, why it happens, and what rr does about it."""

    code: str
    title: str
    symptom: str
    cause: str
    handling: str


GROUPS: dict[str, str] = {
    "A": "Addressing the wrong routers",
    "B": "Backward, recompute and lifecycle",
    "C": "Trainer-side semantics",
    "D": "Aligning routes to tokens",
    "E": "Capture-side failures",
    "F": "Memory and speed",
    "G": "Seen in the field since 2026-08",
}
