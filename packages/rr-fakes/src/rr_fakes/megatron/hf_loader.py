"""Deprecated: moved to :mod:`rr_fakes.hf_to_megatron` (this path goes in the next release)."""

from typing import Any

from rr_fakes.megatron import moved_attr

#: The public names of this module, now :mod:`rr_fakes.hf_to_megatron`'s.
MOVED = (
    "HF_LOADER_FAMILIES",
    "HFGPTSpec",
    "UnsupportedCheckpointError",
    "build_gpt_for",
    "build_hf_gpt",
    "hf_gpt_spec",
    "load_hf_weights",
    "megatron_state",
    "read_hf_config",
    "read_hf_state",
)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, MOVED)
