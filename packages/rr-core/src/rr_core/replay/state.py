"""Deprecated: the controller's parts each hold their own state now (:mod:`rr_core.replay.armed`,
:mod:`rr_core.replay.scope`, ...); the names below still work from here for one release, with a
:class:`DeprecationWarning`."""

from __future__ import annotations

from rr_core.replay.moved import moved_names

__getattr__ = moved_names(
    __name__, {"Armed": "rr_core.replay.armed", "DEFAULT_MICROBATCH": "rr_core.replay.scope"}
)
