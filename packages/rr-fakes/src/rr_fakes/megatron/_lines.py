"""The megatron-core lines the CPU harness is tested on, as ``rr_megatron_compat._supported``
holds them (the one home of megatron-core version facts, which the noxfile reads by path)."""

from __future__ import annotations

from rr_megatron_compat._supported import MEGATRON_LINES, SUPPORTED

#: The range the harness supports: the range rr-megatron-compat supports.
MEGATRON_RANGE = SUPPORTED["megatron-core"]

__all__ = ["MEGATRON_LINES", "MEGATRON_RANGE"]
