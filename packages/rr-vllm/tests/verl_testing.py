"""What the verl tests share: a rollout's engine answers in each format and the rows verl's own
code expects of them, the layouts they are checked over, and verl's modules where it imports."""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from rr_core import RouteMeta
from rr_fakes.emulations.engines import (
    VllmEra,
    decode_sglang_routes,
    sglang_response,
    vllm_http_response,
    vllm_request_output,
)
from rr_vllm import DecodeOptions, SampleRoutes, decode_sglang, decode_vllm_http, decode_vllm_output
from vllm_testing import distinct_routes, make_meta

#: (P, G) of the rollout's samples: different prompt and response lengths.
SHAPES = [(5, 4), (3, 1), (7, 6), (2, 8), (6, 3)]
PROMPT_LENGTH, RESPONSE_LENGTH = 8, 9
DENSE_FIRST = make_meta(num_experts=16, dense=(1,), layers=5, top_k=4)  # M * K = 16
ALL_MOE = make_meta(num_experts=12, layers=3, top_k=3)  # M * K = 9: the re-encoding concat
LAYOUTS = {"dense_first": DENSE_FIRST, "all_moe": ALL_MOE}
FORMATS = ("vllm_int32", "vllm_uint8", "vllm_http", "sglang")


@dataclasses.dataclass
class Rollout:
    """One engine format's answers for SHAPES, the rr samples decoded from them, and what verl's
    rollout servers hand its agent loop (``outputs[0].routed_experts``, or SGLang's int32
    array reshaped to ``[N, L, K]``)."""

    samples: list[SampleRoutes | None]
    engine_rows: list[np.ndarray]
    prompts: list[list[int]]
    responses: list[list[int]]
    raw: list[Any]


def rollout(fmt: str, meta: RouteMeta, shapes: list[tuple[int, int]] = SHAPES) -> Rollout:
    L, K = len(meta.layer_numbers), meta.top_k
    out = Rollout([], [], [], [], [])
    for i, (p, g) in enumerate(shapes):
        prompt, response = list(range(2, 2 + p)), list(range(2, 2 + g))
        ids = distinct_routes(meta, p + g - 1, seed=i)
        if fmt == "sglang":
            answer = sglang_response(prompt_ids=prompt, generated_ids=response, routes_TLK=ids)
            out.samples.append(decode_sglang(answer, DecodeOptions(meta=meta)).only())
            out.engine_rows.append(
                decode_sglang_routes(answer["meta_info"]["routed_experts"], L, K)
            )
        else:
            era = VllmEra.V0_14 if fmt == "vllm_int32" else VllmEra.V0_22
            answer = vllm_request_output(
                era,
                prompt_ids=prompt,
                generated_ids=response,
                routes_TLK=ids,
                num_experts=meta.num_experts,
                request_id=str(i),
                use_real_vllm=False,
            )
            if fmt == "vllm_http":
                out.samples += decode_vllm_http(
                    vllm_http_response(answer), DecodeOptions(meta=meta)
                )
            else:
                out.samples += decode_vllm_output(answer, DecodeOptions(meta=meta))
            out.engine_rows.append(answer.outputs[0].routed_experts)
        out.prompts.append(prompt)
        out.responses.append(response)
        out.raw.append(answer)
    return out


def expected_nested_values(r: Rollout) -> torch.Tensor:
    """Written out here: each sample's T rows, the engine's at the top, int16."""
    parts = []
    for rows, p, g in zip(r.engine_rows, r.prompts, r.responses, strict=True):
        t = np.zeros((len(p) + len(g), *rows.shape[1:]), dtype=np.int16)
        t[: rows.shape[0]] = rows
        parts.append(t)
    return torch.from_numpy(np.concatenate(parts))


def expected_padded(r: Rollout, prompt_length: int, response_length: int) -> torch.Tensor:
    _, L, K = r.engine_rows[0].shape
    out = torch.zeros((len(r.prompts), prompt_length + response_length, L, K), dtype=torch.int16)
    for b, (rows, p) in enumerate(zip(r.engine_rows, r.prompts, strict=True)):
        start = prompt_length - len(p)
        out[b, start : start + rows.shape[0]] = torch.from_numpy(rows.astype(np.int16))
    return out


def as_codec(values: torch.Tensor, codec: str) -> torch.Tensor:
    """What a codec gives back: ``set`` sorts each row's K ids."""
    return values.sort(dim=-1).values if codec == "set" else values


def verl_modules() -> SimpleNamespace:
    """verl 0.9.1's agent loop, padding and router-replay modules (the test skips where verl or one
    of its imports is missing)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron's fallbacks without apex / TE
            from rr_fakes.shims.megatron import megatron_cpu

            with megatron_cpu():
                from verl.experimental.agent_loop import agent_loop
                from verl.utils.megatron import router_replay_utils
                from verl.utils.tensordict_utils import list_of_dict_to_tensordict
                from verl.workers.utils import padding
    except Exception as e:  # verl or one of its imports is missing
        pytest.skip(f"verl 0.9.1 is not importable here ({type(e).__name__}: {e})")
    return SimpleNamespace(
        agent_loop=agent_loop,
        padding=padding,
        list_of_dict_to_tensordict=list_of_dict_to_tensordict,
        left_right_2_no_padding=padding.left_right_2_no_padding,
        replay=router_replay_utils,
    )
