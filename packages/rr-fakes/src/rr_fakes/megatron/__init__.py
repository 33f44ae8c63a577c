"""Deprecated aliases only: the old paths of :mod:`rr_fakes.hf_to_megatron`'s names,
``rr_fakes.megatron.hf_loader`` and ``rr_fakes.megatron.bridge_hf``, kept for one release: each
name read there warns (``DeprecationWarning`` naming the new path) and answers from the new
module. The CPU harness that lived here is :mod:`rr_fakes.shims.megatron` (moved without an
alias: rr-fakes' module paths are the test harness's, not an API)."""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

NEW_PATH = "rr_fakes.hf_to_megatron"

#: Each old module and the public names it had, now :mod:`rr_fakes.hf_to_megatron`'s.
MOVED: dict[str, tuple[str, ...]] = {
    "hf_loader": (
        "HF_LOADER_FAMILIES", "HFGPTSpec", "UnsupportedCheckpointError", "build_gpt_for",
        "build_hf_gpt", "hf_gpt_spec", "load_hf_weights", "megatron_state", "read_hf_config",
        "read_hf_state",
    ),
    "bridge_hf": ("BRIDGE_FAMILIES", "BRIDGE_UNSUPPORTED", "BridgeFamily", "convert_hf_checkpoint"),
}  # fmt: skip


class _MovedModule(types.ModuleType):
    """An old module whose names answer from :mod:`rr_fakes.hf_to_megatron` with a warning."""

    def __init__(self, name: str, names: tuple[str, ...]) -> None:
        super().__init__(name, f"Deprecated: moved to {NEW_PATH} (goes in the next release).")
        self.__all__ = list(names)

    def __getattr__(self, name: str) -> Any:
        if name not in self.__all__:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"{self.__name__}.{name} moved to {NEW_PATH}.{name}; import it from {NEW_PATH} "
            f"(the old path goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        import rr_fakes.hf_to_megatron as new

        return getattr(new, name)


for _short, _names in MOVED.items():
    _module = _MovedModule(f"{__name__}.{_short}", _names)
    sys.modules[_module.__name__] = _module
    globals()[_short] = _module


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"rr_fakes.megatron.{name}: the CPU harness moved to rr_fakes.shims.megatron "
        f"(no alias); the Hugging Face conversion is rr_fakes.hf_to_megatron"
    )
