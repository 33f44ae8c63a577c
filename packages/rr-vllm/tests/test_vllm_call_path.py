"""The routes a user hands to the decoders pass each rr_vllm module once.

A decode is traced call by call (``sys.setprofile``): a module is *entered* when a function of it
is called from another module. Along one call (``decode_vllm_output(...)``, then
``.to_batch()``) of one request with one completion, no module is entered twice, except
:mod:`rr_vllm.fields` (typed readers of outside data, which call nothing back), and no call
stack holds a module twice with another between (A -> B -> A: a bounce).
"""

from __future__ import annotations

import collections
import sys
import warnings
from collections.abc import Callable
from types import FrameType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rr_vllm import DecodeOptions, decode_vllm_batch, decode_vllm_output
from vllm_testing import make_meta

META = make_meta(layers=3, dense=(1,))  # 8 experts, top-2
#: Leaf readers: called from every decoder, they call no other rr_vllm module.
LEAVES = {"rr_vllm.fields"}


def _request(dtype: type[np.integer[Any]]) -> SimpleNamespace:
    rows = np.zeros((4, 3, 2), dtype)  # P=3, G=2: T-1 rows
    rows[:, 1:] = [[0, 1], [2, 3]]
    completion = SimpleNamespace(
        index=0, token_ids=[21, 22], finish_reason="length", routed_experts=rows
    )
    return SimpleNamespace(request_id="r0", prompt_token_ids=[1, 2, 3], outputs=[completion])


def _module(frame: FrameType) -> str | None:
    name = str(frame.f_globals.get("__name__", ""))
    return name if name.split(".")[0] == "rr_vllm" else None


def trace(call: Callable[[], object]) -> tuple[collections.Counter[str], list[list[str]]]:
    """Entries per rr_vllm module during ``call()``, and each bounce (the stack's modules from
    the first visit to the second)."""
    entries: collections.Counter[str] = collections.Counter()
    bounces: list[list[str]] = []
    stack: list[str | None] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = _module(frame)
            if module is not None and (not stack or stack[-1] != module):
                entries[module] += 1
                path = [m for i, m in enumerate(stack) if m and (i == 0 or stack[i - 1] != m)]
                if module in path:
                    bounces.append([*path[path.index(module) :], module])
            stack.append(module if module is not None else (stack[-1] if stack else None))
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entries, bounces


def _check_once(call: Callable[[], object]) -> collections.Counter[str]:
    entries, bounces = trace(call)
    assert not bounces, f"modules visited twice on one call stack: {bounces}"
    twice = {m: n for m, n in entries.items() if n > 1 and m not in LEAVES}
    assert not twice, f"modules entered more than once: {twice} (all: {dict(entries)})"
    return entries


@pytest.mark.parametrize("dtype", [np.uint8, np.int32], ids=["one-copy", "per-sample"])
def test_decode_then_batch_visits_each_module_once(dtype: type[np.integer[Any]]) -> None:
    options = DecodeOptions(meta=META)
    decode_vllm_output([_request(dtype)], options).to_batch()  # every module imported first
    routes: list[Any] = []
    read = _check_once(lambda: routes.append(decode_vllm_output([_request(dtype)], options)))
    assert "rr_vllm.vllm.decode" in read
    batched = _check_once(routes[0].to_batch)
    assert {"rr_vllm.vllm.decode", "rr_vllm.samples"} <= set(batched)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32], ids=["one-copy", "per-sample"])
def test_the_deprecated_batch_call_visits_each_module_once(dtype: type[np.integer[Any]]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        decode_vllm_batch([_request(dtype)], META)
        _check_once(lambda: decode_vllm_batch([_request(dtype)], META))


def test_the_check_fails_on_a_bounce_and_on_a_second_entry() -> None:
    """The check can fail: functions of two made-up rr_vllm modules, A -> B -> A, then B again."""
    a: dict[str, Any] = {"__name__": "rr_vllm.made_up_a"}
    b: dict[str, Any] = {"__name__": "rr_vllm.made_up_b"}
    exec("def back():\n    return 1\ndef first():\n    return B()", a)
    exec("def middle():\n    return A()", b)
    a["B"], b["A"] = b["middle"], a["back"]
    entries, bounces = trace(a["first"])
    assert entries == {"rr_vllm.made_up_a": 2, "rr_vllm.made_up_b": 1}
    assert bounces == [["rr_vllm.made_up_a", "rr_vllm.made_up_b", "rr_vllm.made_up_a"]]
    with pytest.raises(AssertionError, match="visited twice on one call stack"):
        _check_once(a["first"])
    with pytest.raises(AssertionError, match="entered more than once"):
        _check_once(lambda: (b["middle"](), b["middle"]()))
