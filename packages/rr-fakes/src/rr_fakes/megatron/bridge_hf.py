"""Deprecated: moved to :mod:`rr_fakes.hf_to_megatron` (this path goes in the next release)."""

from typing import Any

from rr_fakes.megatron import moved_attr

#: The public names of this module, now :mod:`rr_fakes.hf_to_megatron`'s.
MOVED = (
    "BRIDGE_FAMILIES",
    "BRIDGE_UNSUPPORTED",
    "BridgeFamily",
    "convert_hf_checkpoint",
)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, MOVED)
