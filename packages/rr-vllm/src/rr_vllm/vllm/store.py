"""vLLM 0.32+'s aux-output store: sizing its ``max_bytes`` and explaining its eviction error.

From 0.32 the routes go through a host store of ``AuxOutputConfig.max_bytes``; when a prefix-cache
hit needs rows that the store already evicted, vLLM raises ``BlockObjectStoreError`` (offline) or
answers with an error body (HTTP). Either becomes :class:`RouteStoreEvictedError`, naming the fix.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from rr_core.checks import describe
from rr_vllm.capture import ModelGeometry, check_geometry
from rr_vllm.error_body import check_error_body as check_body
from rr_vllm.errors import CaptureError, EngineOutputError, RouteStoreEvictedError
from rr_vllm.fields import integer

_MARKERS = ("BlockObjectStoreError", "auxiliary output object does not exist")


def routes_store_max_bytes(
    geometry: ModelGeometry, num_tokens: int, *, headroom: float = 1.25
) -> int:
    """Bytes the store needs for ``num_tokens`` cached token rows (``L * K`` ids of 1 or 2 bytes
    each), times ``headroom``."""
    geometry = check_geometry(geometry, "routes_store_max_bytes")
    n = integer(num_tokens, "num_tokens", error=CaptureError, minimum=1)
    if not isinstance(headroom, int | float) or isinstance(headroom, bool) or not headroom >= 1:
        raise CaptureError(f"need num_tokens >= 1 and headroom >= 1; got {n}, {headroom}")
    return math.ceil(n * geometry.route_bytes_per_token * headroom)


def _fix(geometry: ModelGeometry | None, max_cached_tokens: int | None) -> str:
    fix = "raise AuxOutputConfig.max_bytes (aux_output_config={'max_bytes': ...})"
    if geometry is not None and max_cached_tokens is not None:
        need = routes_store_max_bytes(geometry, max_cached_tokens, headroom=2.0)
        fix += (
            f", e.g. to {need} (2x {max_cached_tokens} cached tokens x "
            f"{geometry.route_bytes_per_token} bytes per token)"
        )
    return fix + ", or resubmit the request"


def is_store_eviction(error: BaseException | str) -> bool:
    """Does this exception (or error message) come from the 0.32+ aux-output store?"""
    if not isinstance(error, BaseException | str):
        raise EngineOutputError(
            f"is_store_eviction takes an exception or its message; got {describe(error)}"
        )
    if isinstance(error, BaseException):
        if any(type(e).__name__ == "BlockObjectStoreError" for e in _chain(error)):
            return True
        error = str(error)
    return any(m in error for m in _MARKERS)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def store_eviction_error(
    error: BaseException | str,
    *,
    geometry: ModelGeometry | None = None,
    max_cached_tokens: int | None = None,
) -> RouteStoreEvictedError:
    """The clear error for a store eviction (see :func:`is_store_eviction`)."""
    return RouteStoreEvictedError(
        f"vLLM's aux-output store (0.32+) evicted route rows that a prefix-cache hit needed "
        f"({type(error).__name__ if isinstance(error, BaseException) else 'error'}: {error}); "
        f"the routes of this request are lost: {_fix(geometry, max_cached_tokens)}"
    )


@contextlib.contextmanager
def explain_store_errors(
    *, geometry: ModelGeometry | None = None, max_cached_tokens: int | None = None
) -> Iterator[None]:
    """Re-raise vLLM's ``BlockObjectStoreError`` (around ``llm.generate`` or an output loop) as
    :class:`RouteStoreEvictedError` with the ``max_bytes`` fix; other errors pass unchanged."""
    if geometry is not None:
        check_geometry(geometry, "explain_store_errors")
    if max_cached_tokens is not None:
        integer(max_cached_tokens, "max_cached_tokens", error=CaptureError, minimum=1)
    try:
        yield
    except Exception as e:
        if is_store_eviction(e):
            raise store_eviction_error(
                e, geometry=geometry, max_cached_tokens=max_cached_tokens
            ) from e
        raise


def explain_error_body(message: str, kind: Any) -> RouteStoreEvictedError | None:
    """A store eviction named by an HTTP error body's message or type, as
    :class:`RouteStoreEvictedError`; None for any other error."""
    if is_store_eviction(message) or kind == "BlockObjectStoreError":
        return store_eviction_error(message)
    return None


def check_error_body(response: Mapping[str, Any]) -> None:
    """An HTTP error body (``{"error": {...}}`` or ``{"object": "error", ...}``) raises: a
    store eviction as :class:`RouteStoreEvictedError`, anything else as EngineOutputError."""
    check_body(response, explain=explain_error_body)
