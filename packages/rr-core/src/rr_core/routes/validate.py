"""Checks on the structure of route data (tensors, dtypes, meta, offsets, padding); the id
checks are in :mod:`rr_core.routes.validate_ids`.

Shape legend: N total token rows, B sequences, S padded length, L layer slots, K top-k.
"""

from __future__ import annotations

import operator
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from rr_core.errors import LayoutError, RouteValidationError
from rr_core.routes.axis import check_layer_axis

if TYPE_CHECKING:
    from rr_core.routes.meta import RouteMeta

ArrayLike = torch.Tensor | npt.NDArray[Any]

# torch supports few operations on these; widen them (exactly) before anything else touches them.
_WIDEN = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


def is_integer_dtype(dtype: torch.dtype) -> bool:
    return dtype != torch.bool and not dtype.is_floating_point and not dtype.is_complex


def as_tensor(x: ArrayLike, what: str) -> torch.Tensor:
    """A torch view of ``x``; numpy arrays torch cannot share (read-only, byte-swapped, negatively
    strided) are copied first, since ``torch.from_numpy`` would alias or reject them."""
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        elif not x.flags.writeable or any(s < 0 for s in x.strides):
            x = x.copy()
        return torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise RouteValidationError(f"{what} must be a torch.Tensor or numpy array; got {type(x)}")
    return x


def as_int_tensor(x: ArrayLike, what: str) -> torch.Tensor:
    """:func:`as_tensor` for integer data, with wide unsigned dtypes widened to signed ones."""
    t = as_tensor(x, what)
    if not is_integer_dtype(t.dtype):
        raise RouteValidationError(f"{what} must have an integer dtype; got {t.dtype}")
    return t.to(_WIDEN[t.dtype]) if t.dtype in _WIDEN else t


def as_bool(x: ArrayLike, what: str) -> torch.Tensor:
    t = as_tensor(x, what)
    if t.dtype != torch.bool:
        raise RouteValidationError(f"{what} must be a bool mask; got {t.dtype}")
    return t


def _ints(name: str, values: Any) -> tuple[int, ...]:
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError as e:
        raise LayoutError(f"RouteMeta.{name} must hold integers; got {values!r}") from e


def check_meta(meta: RouteMeta) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Checked ``(layer_numbers, moe_layer_numbers)``, the latter None when it names every slot."""
    e, k = meta.num_experts, meta.top_k
    if isinstance(e, bool) or not isinstance(e, int) or e < 1:
        raise RouteValidationError(f"RouteMeta.num_experts must be an int >= 1; got {e!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e:
        raise RouteValidationError(
            f"RouteMeta.top_k must be an int in [1, num_experts={e}]; got {k!r}"
        )
    check_layer_axis(meta.layer_axis, "RouteMeta.layer_axis")
    layers = _ints("layer_numbers", meta.layer_numbers)
    if not layers or layers[0] < 1 or any(b <= a for a, b in pairwise(layers)):
        raise LayoutError(
            "RouteMeta.layer_numbers must be non-empty, 1-based and strictly increasing; got "
            f"{layers}"
        )
    if meta.layer_axis == "all_layers" and layers[-1] - layers[0] + 1 != len(layers):
        raise LayoutError(
            "on the all_layers axis every decoder layer has a slot, so layer_numbers must be "
            f"consecutive; got {layers} (use the moe_layers axis for a subset)"
        )
    raw = meta.moe_layer_numbers
    moe = layers if raw is None else _ints("moe_layer_numbers", raw)
    if not moe or any(b <= a for a, b in pairwise(moe)) or not set(moe) <= set(layers):
        raise LayoutError(
            "RouteMeta.moe_layer_numbers must be a non-empty, strictly increasing subset of "
            f"layer_numbers {layers}; got {moe}"
        )
    if meta.layer_axis == "moe_layers" and moe != layers:
        raise LayoutError(
            "on the moe_layers axis every slot is an MoE layer, so moe_layer_numbers must equal "
            f"layer_numbers {layers}; got {moe}"
        )
    return layers, None if moe == layers else moe


def check_padded(values_BSLK: torch.Tensor, mask_BS: torch.Tensor, valid_BS: torch.Tensor) -> None:
    """Padded routes, token mask and validity agree, and no padding position claims a route."""
    if values_BSLK.dim() != 4 or mask_BS.dim() != 2 or values_BSLK.shape[:2] != mask_BS.shape:
        raise RouteValidationError(
            f"padded routes must be [B, S, L, K] with token_mask_BS [B, S]; got "
            f"{tuple(values_BSLK.shape)} and {tuple(mask_BS.shape)}"
        )
    if valid_BS.shape != mask_BS.shape:
        raise RouteValidationError(
            f"valid_BS has shape {tuple(valid_BS.shape)}; token_mask_BS has {tuple(mask_BS.shape)}"
        )
    stray_BS = valid_BS & ~mask_BS
    if bool(stray_BS.any()):
        b, s = _first(stray_BS)
        raise RouteValidationError(
            f"valid_BS marks padding as a route: sequence {b}, position {s} is not a token in "
            "token_mask_BS; padding rows must be invalid"
        )


def check_structure(
    values_NLK: torch.Tensor, offsets_B1: torch.Tensor, valid_N: torch.Tensor, meta: RouteMeta
) -> None:
    """Shapes, dtypes and offsets agree with each other and with ``meta``."""
    if values_NLK.dim() != 3:
        raise RouteValidationError(
            f"route values must be 3-D [N, L, K]; got shape {tuple(values_NLK.shape)}"
        )
    if not is_integer_dtype(values_NLK.dtype):
        raise RouteValidationError(f"route values must be integer ids; got {values_NLK.dtype}")
    N, L, K = values_NLK.shape
    if len(meta.layer_numbers) != L:
        raise RouteValidationError(
            f"route values have L={L} layer slots but meta.layer_numbers has "
            f"{len(meta.layer_numbers)} on the {meta.layer_axis} axis "
            f"(layers {meta.layer_numbers[0]}..{meta.layer_numbers[-1]}); fix the meta or "
            "convert the routes with to_layer_axis"
        )
    if meta.top_k != K:
        raise RouteValidationError(f"route values have K={K} ids per row; meta.top_k={meta.top_k}")
    if offsets_B1.dim() != 1 or offsets_B1.numel() < 1 or offsets_B1.dtype != torch.int64:
        raise RouteValidationError(
            f"offsets_B1 must be a non-empty 1-D int64 tensor [B+1]; got shape "
            f"{tuple(offsets_B1.shape)}, dtype {offsets_B1.dtype}"
        )
    offsets = offsets_B1.tolist()
    if offsets[0] != 0 or offsets[-1] != N:
        raise RouteValidationError(
            f"offsets_B1 must start at 0 and end at N={N} (the number of rows); got "
            f"{offsets[0]}..{offsets[-1]}"
        )
    shrink_B = offsets_B1.diff() < 0
    if bool(shrink_B.any()):
        b = int(shrink_B.nonzero()[0])
        raise RouteValidationError(
            f"offsets_B1 decrease at sequence {b}: {offsets[b]} -> {offsets[b + 1]}; offsets "
            "must not decrease"
        )
    if valid_N.dtype != torch.bool or tuple(valid_N.shape) != (N,):
        raise RouteValidationError(
            f"valid_N must be a bool tensor [N={N}]; got shape {tuple(valid_N.shape)}, "
            f"dtype {valid_N.dtype}"
        )
    if not (values_NLK.device == offsets_B1.device == valid_N.device):
        raise RouteValidationError(
            f"values, offsets and valid must share a device; got {values_NLK.device}, "
            f"{offsets_B1.device}, {valid_N.device}"
        )


def _first(mask: torch.Tensor) -> list[int]:
    return [int(i) for i in mask.nonzero()[0]]
