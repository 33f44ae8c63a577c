"""What a decoder accepts as a payload: bytes, not the ids of another dtype."""

from __future__ import annotations

import torch

from rr_core.errors import CodecError


def payload_as_bytes(payload: object, expected: int, codec: str) -> torch.Tensor:
    """The payload as a flat uint8 tensor. A payload is bytes: another dtype is accepted only
    as a byte view of a contiguous buffer of exactly the payload's byte length (words holding
    the bytes); a payload widened element by element (each byte now an int16 / int32 / int64,
    as a framework's collate leaves it) would decode to other ids, so it is refused by dtype."""
    if not isinstance(payload, torch.Tensor):
        raise CodecError(
            f"the {codec!r} payload must be a uint8 torch.Tensor; got {type(payload).__name__}"
        )
    if payload.dtype == torch.uint8:
        return payload.reshape(-1)
    whole = payload.is_contiguous() and payload.numel() * payload.element_size() == expected
    if whole and not payload.dtype.is_complex and payload.dtype != torch.bool:
        return payload.reshape(-1).view(torch.uint8)
    raise CodecError(
        f"the {codec!r} payload must be uint8 bytes ({expected} of them); got dtype "
        f"{payload.dtype} with {payload.numel()} elements: a payload widened to another dtype "
        "decodes to other ids; pass the original uint8 tensor (or .view(torch.uint8) of the "
        "buffer that holds its bytes)"
    )
