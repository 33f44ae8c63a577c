"""Deprecated: the checks on replay targets live in :mod:`rr_core.replay.checks`; the name below
still works from here for one release, with a :class:`DeprecationWarning`."""

from __future__ import annotations

from rr_core.replay.moved import moved_names

__getattr__ = moved_names(__name__, {"check_target_ids": "rr_core.replay.checks"})
