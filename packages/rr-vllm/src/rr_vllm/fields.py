"""Reading fields of outside data (JSON answers, engine objects) with typed errors.

Engine answers are outside data: a key may be missing or hold another type than the protocol
says. Each reader here raises :class:`~rr_vllm.EngineOutputError` naming the field, what was
expected and what came, instead of letting a ``KeyError`` or ``AttributeError`` escape, and never
coerces (``int(5.7)`` would silently place rows at other tokens).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from rr_vllm.errors import EngineOutputError

_MISSING = object()


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def as_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise EngineOutputError(
            f"{what} must be a JSON object (a mapping); got {_shown(value)}: pass the parsed "
            "JSON answer (response.json())"
        )
    return value


#: The most tokens a sample or a batch dimension may have (an int32 index).
MAX_TOKENS = 2**31 - 1


def chunks_of(value: Any, what: str) -> Iterable[Any]:
    """The chunks of a stream: a list or an iterator (a mapping, a number or None is none)."""
    array = hasattr(
        value, "ndim"
    )  # a tensor or an array is never a stream (a 0-d one not even iterable)
    if array or isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise EngineOutputError(
            f"{what} must be a list or an iterator of chunks; got {_shown(value)}"
        )
    return value


def utf8(value: str | bytes, what: str) -> str:
    """Text of an answer; bytes must be UTF-8 (as JSON and SSE are)."""
    if isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError as e:
        raise EngineOutputError(f"{what} is not UTF-8 text ({e})") from e


def integer(
    value: Any,
    what: str,
    *,
    error: type[Exception] = EngineOutputError,
    minimum: int | None = 0,
    maximum: int | None = None,
) -> int:
    """An ``int`` (or an integer scalar) in ``[minimum, maximum]`` (None: unbounded); a bool,
    float or string raises ``error`` (``int(5.7)`` would silently place rows at other tokens)."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    low = n is not None and minimum is not None and n < minimum
    if n is None or low or (maximum is not None and n > maximum):
        bound = "" if minimum is None else f" >= {minimum}"
        bound += "" if maximum is None else f" and <= {maximum}"
        raise error(f"{what} must be an integer{bound}; got {_shown(value)}")
    return n


def count(value: Any, what: str) -> int:
    """A token count of an engine answer: an integer in ``[0, MAX_TOKENS]``."""
    return integer(value, what, maximum=MAX_TOKENS)


def token_count(value: Any, what: str) -> int:
    """The length of a token-id list (list, tuple, array; not a string or mapping)."""
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__len__"):
        raise EngineOutputError(f"{what} must be a list of token ids; got {_shown(value)}")
    try:
        return len(value)
    except TypeError as e:  # a 0-d array has __len__ but no length
        raise EngineOutputError(f"{what} must be a list of token ids; got {_shown(value)}") from e


def reason(value: Any, what: str) -> str | None:
    """A ``finish_reason``: a string or None."""
    if value is not None and not isinstance(value, str):
        raise EngineOutputError(f"{what} must be a string or null; got {_shown(value)}")
    return value


def attr(obj: Any, name: str, what: str) -> Any:
    """``obj.name`` of an engine object; a missing attribute names the object's type."""
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise EngineOutputError(
            f"{what} ({type(obj).__name__}) has no attribute {name!r}: not a vLLM "
            "RequestOutput / CompletionOutput"
        )
    return value


def key(body: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in body:
        raise EngineOutputError(
            f"{what} has no {name!r} (keys: {sorted(map(str, body))[:8]}): pass the whole "
            "parsed JSON answer (response.json()), not a part of it or a streaming chunk"
        )
    return body[name]


def integers(values: Any, what: str, *, error: type[Exception] = EngineOutputError) -> list[int]:
    """A flat list of integers >= 0 from a sequence or an integer tensor / array."""
    if hasattr(values, "tolist") and hasattr(values, "dtype"):
        kind = getattr(values.dtype, "kind", None)  # numpy
        is_int = (
            kind in ("i", "u")
            if kind is not None
            else not (
                values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == bool
            )
        )
        if not is_int:
            raise error(f"{what} must hold integers; got dtype {values.dtype}")
        values = values.reshape(-1).tolist()
    if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__iter__"):
        raise error(f"{what} must be a sequence of integers; got {_shown(values)}")
    return [integer(v, f"{what}[{i}]", error=error) for i, v in enumerate(values)]
