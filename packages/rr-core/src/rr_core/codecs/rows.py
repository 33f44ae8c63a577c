"""The valid rows of a batch, gathered for encoding with one slice copy per run of valid rows.

A rollout batch has one run per sample (all its rows but the last); boolean indexing gathers it
row by row, several times slower than the copies. The runs are split across threads
(:func:`rr_core.threads.over_ranges`: numpy's copies release the GIL).
"""

from __future__ import annotations

import numpy as np
import torch

from rr_core import buffers
from rr_core.threads import over_ranges

#: Runs shorter than this on average are gathered by boolean indexing (fewer Python steps).
_MIN_MEAN_RUN = 16


def valid_rows(values_NLK: torch.Tensor, valid_N: torch.Tensor) -> torch.Tensor:
    """``values_NLK[valid_N]``, a fresh ``[V, L, K]`` tensor."""
    if values_NLK.device.type != "cpu" or values_NLK.requires_grad:
        return values_NLK[valid_N]
    valid = valid_N.numpy()
    edges = np.flatnonzero(np.diff(valid.view(np.int8), prepend=0, append=0))
    starts, stops = edges[::2], edges[1::2]
    if len(starts) * _MIN_MEAN_RUN > valid.size:
        return values_NLK[valid_N]
    at = np.concatenate([[0], np.cumsum(stops - starts)])
    out = buffers.empty((int(at[-1]), *values_NLK.shape[1:]), values_NLK.dtype, values_NLK.device)
    src, dst = values_NLK.numpy(), out.numpy()

    def copy(first: int, last: int) -> None:
        for i in range(first, last):
            dst[at[i] : at[i + 1]] = src[starts[i] : stops[i]]

    over_ranges(len(starts), 1, copy)
    return out


def pack_valid_cpu(valid_N: torch.Tensor) -> torch.Tensor | None:
    """The validity bits of ``pack_valid`` by ``np.packbits`` on the CPU (None elsewhere)."""
    if valid_N.device.type != "cpu":
        return None
    return torch.from_numpy(np.packbits(valid_N.numpy(), bitorder="little"))


def unpack_valid_cpu(bits: torch.Tensor, num_rows: int) -> torch.Tensor | None:
    """The validity mask of ``unpack_valid`` by ``np.unpackbits`` on the CPU (None elsewhere)."""
    if bits.device.type != "cpu" or bits.dtype != torch.uint8:
        return None
    flags = np.unpackbits(bits.contiguous().numpy(), count=num_rows, bitorder="little")
    return torch.from_numpy(flags.view(np.bool_))


def count_valid(valid_N: torch.Tensor) -> int:
    """How many rows are valid; numpy's count on the CPU (torch's bool sum is far slower)."""
    if valid_N.device.type == "cpu":
        return int(np.count_nonzero(valid_N.numpy()))
    return int(valid_N.sum())


def valid_indices(valid_N: torch.Tensor) -> torch.Tensor:
    """The int64 row numbers of the valid rows; numpy's on the CPU."""
    if valid_N.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(valid_N.numpy()))
    return valid_N.nonzero()[:, 0]
