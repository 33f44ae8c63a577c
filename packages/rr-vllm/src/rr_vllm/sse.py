"""Server-sent events as an HTTP client yields them: whole bodies, lines, or byte chunks cut
anywhere (``iter_content``, ``aiter_bytes``: mid-event, mid-line, mid-UTF-8 character).

Lines are reassembled across chunks and bytes decoded incrementally, as the engines' own
clients read their streams. A chunk's last piece with no line end is complete when it is a
``data:`` line whose JSON parses (how ``iter_lines`` hands lines over); otherwise it waits for
the next chunk. Only non-``data`` fields (comments, ``event:``, ``id:``) can be read while cut,
and those are skipped either way.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rr_vllm.errors import EngineOutputError
from rr_vllm.fields import chunks_of


def _complete(piece: str) -> bool:
    """Whether a piece without a line end can be read now: anything but a data line (or the
    start of one) that does not parse yet."""
    line = piece.strip()
    if not line:
        return False  # nothing to read yet; a blank line only separates events
    if "data:".startswith(line) or line.startswith("data:"):
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return True
        try:
            json.loads(data)
        except ValueError:
            return False
        return True
    return True


def sse_items(stream: Iterable[Any], what: str) -> Iterator[str | Mapping[str, Any]]:
    """The ``data:`` payloads of an SSE stream (str, without the ``data:`` field name), or the
    parsed chunks (mappings) where the stream already holds them, in order. A whole body (one
    str or bytes) is one item, not its characters. Text that is not UTF-8, and items that are
    neither text nor mappings, raise :class:`~rr_vllm.EngineOutputError`."""
    if isinstance(stream, str | bytes | bytearray):
        stream = [stream]
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    for item in chunks_of(stream, what):
        if isinstance(item, Mapping):
            yield item
            continue
        if isinstance(item, bytes | bytearray | memoryview):
            try:
                text = decoder.decode(bytes(item))
            except UnicodeDecodeError as e:
                raise EngineOutputError(f"{what} is not UTF-8 text ({e})") from e
        elif isinstance(item, str):
            text = item
        else:
            raise EngineOutputError(
                f"{what} is SSE text (str / bytes, whole, by line or in chunks) or parsed chunks "
                f"(dicts); got {type(item).__name__}"
            )
        lines = (pending + text).splitlines(keepends=True)
        pending = ""
        if lines and not lines[-1].endswith(("\n", "\r")) and not _complete(lines[-1]):
            pending = lines.pop()
        yield from _data(lines)
    try:
        pending += decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise EngineOutputError(f"{what} ends inside a UTF-8 character ({e}): cut") from e
    yield from _data([pending])


def _data(lines: list[str]) -> Iterator[str]:
    for raw in lines:
        line = raw.strip()
        if line.startswith("data:"):  # blank separators, comments, event:/id: are skipped
            yield line[len("data:") :].strip()
