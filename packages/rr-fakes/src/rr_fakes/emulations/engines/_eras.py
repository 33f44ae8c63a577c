"""The rollout-engine eras whose routed-experts output differs (``vllm-facts.md``)."""

from __future__ import annotations

import enum

import numpy as np


class VllmEra(enum.Enum):
    """One value per vLLM output format."""

    V0_14 = "0.14-0.20"  # CompletionOutput.routed_experts, int32, P+G-1 rows, all layers
    V0_21 = "0.21"  # prompt / generation arrays, int16, MoE layers only, -1 for cached prefix
    V0_22 = "0.22-0.31"  # uint8 / uint16, routed_experts_prompt_start, all layers
    V0_32 = "0.32+"  # same format through the aux-output store (prefix caching required)

    @property
    def has_prompt_start(self) -> bool:
        """Does ``SamplingParams.routed_experts_prompt_start`` exist?"""
        return self in (VllmEra.V0_22, VllmEra.V0_32)


def era_of(version: str) -> VllmEra:
    """The era of a vLLM version string such as ``"0.21.1"``; below 0.14 there is no capture."""
    parts = version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()))
    except (IndexError, ValueError) as err:
        raise ValueError(f"cannot parse vLLM version {version!r}") from err
    if (major, minor) < (0, 14):
        raise ValueError(f"vLLM {version} returns no routed experts (capture arrived in 0.14)")
    if (major, minor) <= (0, 20):
        return VllmEra.V0_14
    if (major, minor) == (0, 21):
        return VllmEra.V0_21
    if (major, minor) <= (0, 31):
        return VllmEra.V0_22
    return VllmEra.V0_32


def era_dtype(era: VllmEra, num_experts: int) -> np.dtype[np.integer]:
    """The dtype an era returns ids in."""
    if era is VllmEra.V0_14:
        return np.dtype(np.int32)
    if era is VllmEra.V0_21:
        return np.dtype(np.int16)
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype(np.uint16)
