"""vLLM's ``CompletionOutput`` / ``RequestOutput``: the real classes when ``vllm`` imports,
duck-typed dataclasses with the same field names otherwise.

Fields that a version lacks in its constructor (``prompt_routed_experts`` exists on 0.21 only)
are set as attributes after construction, so ``hasattr`` tells the eras apart as it does on the
real objects: the emulated ``RequestOutput`` has no ``prompt_routed_experts`` field either.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CompletionOutput:
    """Duck-typed ``vllm.outputs.CompletionOutput`` (one sampled continuation)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """Duck-typed ``vllm.outputs.RequestOutput`` (a request and its completions)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: Any
    outputs: list[Any]
    finished: bool
    metrics: Any = None
    lora_request: Any = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    kv_transfer_params: dict[str, Any] | None = field(default=None)


@functools.cache
def real_vllm_outputs() -> tuple[type, type] | None:
    """``(CompletionOutput, RequestOutput)`` from the installed vllm, or None without it."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        module = importlib.import_module("vllm.outputs")
    except ImportError:
        return None
    return module.CompletionOutput, module.RequestOutput


def construct(cls: type, fields: Mapping[str, Any]) -> Any:
    """``cls(**accepted)`` then ``setattr`` for the fields its constructor does not take."""
    parameters = inspect.signature(cls).parameters
    accepted = {k: v for k, v in fields.items() if k in parameters}
    obj = cls(**accepted)
    for name, value in fields.items():
        if name not in accepted:
            setattr(obj, name, value)
    return obj


def output_classes(use_real: bool | None) -> tuple[type, type]:
    """The classes to build: ``use_real`` None picks the real ones when vllm imports."""
    real = real_vllm_outputs() if use_real is not False else None
    if use_real and real is None:
        raise ImportError("use_real_vllm=True but `import vllm.outputs` fails here")
    return real if real is not None else (CompletionOutput, RequestOutput)
