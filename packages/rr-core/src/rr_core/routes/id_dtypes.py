"""Expert id dtypes: the narrowest integer dtype that holds every id of E experts exactly, and the
cast to it that refuses ids it would wrap (E4)."""

from __future__ import annotations

import torch

from rr_core.checks import as_index
from rr_core.errors import RouteValidationError
from rr_core.routes.validate import ArrayLike, as_int_tensor, as_tensor


def holds_ids(dtype: torch.dtype, num_experts: int) -> bool:
    """Whether an integer ``dtype`` holds every id in ``[0, num_experts)`` exactly (uint8 holds
    256 experts' ids, int16 32768); False for float and bool dtypes, which hold no ids."""
    if not isinstance(dtype, torch.dtype):
        raise RouteValidationError(f"dtype must be a torch.dtype; got {dtype!r}")
    num_experts = as_index(num_experts, "num_experts", RouteValidationError)
    if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
        return False
    return int(torch.iinfo(dtype).max) >= num_experts - 1


def narrowest_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype that holds every id in ``[0, num_experts)`` exactly."""
    num_experts = as_index(num_experts, "num_experts", RouteValidationError)
    if num_experts < 1:
        raise RouteValidationError(f"num_experts must be >= 1; got {num_experts}")
    if num_experts > 2**31:
        raise RouteValidationError(
            f"num_experts must be <= {2**31} (int32 ids, the widest rr stores); got {num_experts}"
        )
    if num_experts <= 256:
        return torch.uint8
    return torch.int16 if num_experts <= 32768 else torch.int32


def narrow_ids(ids: ArrayLike, num_experts: int) -> torch.Tensor:
    """Cast expert ids to :func:`narrowest_dtype`, refusing any value the cast would wrap (E4).

    A source dtype too small for ``num_experts`` (uint8 ids of a 384-expert model) is refused too:
    such ids were already wrapped by whoever stored them. Read-only numpy arrays are copied.
    """
    t = as_tensor(ids, "expert ids")
    source = t.dtype
    t = as_int_tensor(t, "expert ids")
    target = narrowest_dtype(num_experts)
    if not holds_ids(source, num_experts):
        raise RouteValidationError(
            f"expert ids arrive as {source}, which holds at most {torch.iinfo(source).max}, but "
            f"num_experts={num_experts} needs ids up to {num_experts - 1}: they were probably "
            f"wrapped when stored (E4 uint8 overflow); store them as {target} or wider; see "
            "`rr explain E4`"
        )
    if t.dtype == target:
        return t
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        info = torch.iinfo(target)
        if lo < info.min or hi > info.max:
            raise RouteValidationError(
                f"expert ids do not fit {target} (range [{info.min}, {info.max}], the narrowest "
                f"dtype for num_experts={num_experts}): source {source} has min {lo}, max {hi}; "
                "zero invalid rows instead of using sentinels, or fix num_experts (E4); see "
                "`rr explain E4`"
            )
    return t.to(target)
