"""An HTTP answer that is an error body instead of choices, read alike for every engine.

vLLM's and SGLang's OpenAI-compatible servers answer a failed request with
``{"error": {"message", "type", "code"}}`` or ``{"object": "error", "message", ...}``. Each
engine's wire and stream decoders call :func:`check_error_body` first; an engine that knows a
cause by name (vLLM's aux-output store eviction) passes ``explain``, which turns the message and
type into its own error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rr_vllm.errors import EngineOutputError

#: An engine's reading of an error body: its own error for a message and type it knows, else None.
Explain = Callable[[str, Any], EngineOutputError | None]


def check_error_body(response: Mapping[str, Any], *, explain: Explain | None = None) -> None:
    """An error body raises: ``explain``'s error where it names the cause, anything else as
    :class:`~rr_vllm.EngineOutputError` with the server's message, type and code. Any other
    answer passes."""
    error = response.get("error")
    if error is None and response.get("object") != "error":
        return
    body = error if isinstance(error, Mapping) else response
    message = str(body.get("message", error))
    if explain is not None:
        named = explain(message, body.get("type"))
        if named is not None:
            raise named
    raise EngineOutputError(
        f"the engine answered with an error instead of choices: {message!r} "
        f"(type {body.get('type')!r}, code {body.get('code')!r})"
    )
