"""Random routes with K distinct expert ids per row, as a real router picks them: the one
generator every package's tests and the harness draw targets and engine routes from.

Deterministic in ``seed`` (or in the ``generator`` passed), never touching torch's global RNG.
"""

from __future__ import annotations

import torch


def distinct_ids(
    *shape: int,
    num_experts: int,
    top_k: int,
    seed: int = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.int64,
) -> torch.Tensor:
    """``[*shape, top_k]`` expert ids, distinct within each row and uniform over the
    ``num_experts`` (the first ``top_k`` of a random permutation per row). Pass ``generator``
    to draw several arrays from one stream; ``seed`` is used only without one."""
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"need 1 <= top_k <= num_experts; got {top_k=}, {num_experts=}")
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    noise = torch.rand(*shape, num_experts, generator=g)
    return noise.argsort(dim=-1)[..., :top_k].to(dtype)
