"""The megatron-core lines the CPU harness is tested on (:mod:`rr_fakes.pins`, which the noxfile
reads by path), and the range it supports: the range rr-megatron-compat publishes for
``rr doctor`` (entry point ``rr.supported``)."""

from __future__ import annotations

from importlib.metadata import entry_points

from rr_fakes.pins import MEGATRON_LINES

(_COMPAT,) = [e for e in entry_points(group="rr.supported") if e.name == "rr-megatron-compat"]

#: The range the harness supports: the range rr-megatron-compat supports.
MEGATRON_RANGE: str = _COMPAT.load()["megatron-core"]

__all__ = ["MEGATRON_LINES", "MEGATRON_RANGE"]
