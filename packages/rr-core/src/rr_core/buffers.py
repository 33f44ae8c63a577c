"""Large CPU buffers. numpy asks the kernel for transparent huge pages on arrays of 4 MiB and
more, torch 2.13's CPU allocator does not: a fresh 400 MB buffer then faults in about 200 pages
instead of 100,000, and its first write runs about 1.8x faster."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Shape = int | tuple[int, ...]


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    return torch.empty(0, dtype=dtype).numpy().dtype


def empty(shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, through numpy on the CPU."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.empty(shape, dtype=_numpy_dtype(dtype)))


def zeros(shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, through numpy on the CPU."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(shape, dtype=_numpy_dtype(dtype)))
