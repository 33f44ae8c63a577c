"""The verl release the verl harness drives, the megatron-core line it runs on and what its
Megatron engine module imports, as :mod:`rr_fakes.pins` holds them (the one home of these pins,
which the noxfile reads by path)."""

from __future__ import annotations

from rr_fakes.pins import (
    VERL_IMPORT_DEPS,
    VERL_MEGATRON_LINE,
    VERL_RELEASE,
    VERL_ROLLOUT_DEPS,
)

__all__ = ["VERL_IMPORT_DEPS", "VERL_MEGATRON_LINE", "VERL_RELEASE", "VERL_ROLLOUT_DEPS"]
