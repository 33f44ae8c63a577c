"""D4 on vLLM 0.34's real output path: a preempted request is re-sent to the workers in full,
like a new one (``vllm/v1/core/sched/scheduler.py``), and its re-prefill recomputes the routes of
every token it had already processed. Those rows are captured but not emitted again: the
aux-output connector restarts a request that has outputs at ``num_tokens - 1``
(``vllm/distributed/aux_output_connector/connector.py``, ``build_connector_meta``), so the
request's chunks stay the first pass's rows up to the preemption, then the resumed rows. The
real ``OutputProcessor`` joins the chunks and rr decodes the whole request as one that ran
through: ``P + G - 1`` rows, each from the forward the sampled token actually saw. Were the
re-prefill's rows emitted as well (the overwrite D4 names), rr refuses the row count.

Skipped below vLLM 0.34 (its output path sent a resumed request as a cached one)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from packaging.version import Version

pytest.importorskip("vllm.outputs", reason="vllm is not installed")

from rr_core import AlignmentError
from rr_vllm import DecodeOptions, decode_vllm_output, installed_vllm_version, validate_samples
from vllm_testing import META, distinct_routes

release = installed_vllm_version()
pytestmark = pytest.mark.skipif(
    release is None or Version(release) < Version("0.34"),
    reason=f"the full re-send after preemption is vLLM 0.34's (installed: {release})",
)

P, G = 5, 4


def run_preempted(chunks: list[tuple[list[int], np.ndarray | None, bool]]) -> Any:
    """Feed one request's engine-core outputs through vLLM's real ``OutputProcessor``; a chunk
    with ``preempt`` set carries the PREEMPTED event and no token. Returns the final
    ``RequestOutput``."""
    from vllm import SamplingParams
    from vllm.v1.engine import (
        EngineCoreEvent,
        EngineCoreEventType,
        EngineCoreOutput,
        EngineCoreRequest,
        FinishReason,
    )
    from vllm.v1.engine.output_processor import OutputProcessor

    request = EngineCoreRequest(
        request_id="r0",
        external_req_id="r0",
        prompt_token_ids=np.arange(3, 3 + P, dtype=np.int32),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=G, detokenize=False),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    processor = OutputProcessor(None, log_stats=False)
    processor.add_request(request, None)
    finals = []
    for i, (tokens, rows, preempt) in enumerate(chunks):
        events = [EngineCoreEvent.new_event(EngineCoreEventType.PREEMPTED)] if preempt else None
        last = i == len(chunks) - 1
        out = EngineCoreOutput(
            "r0",
            tokens,
            routed_experts=rows,
            events=events,
            finish_reason=FinishReason.LENGTH if last else None,
        )
        finals.extend(processor.process_outputs([out]).request_outputs)
    assert finals[-1].finished
    return finals[-1]


def first_pass_and_resume(rows: np.ndarray, rerouted: np.ndarray | None = None) -> list[Any]:
    """Prefill (rows 0..P-1, first token), one decode (row P), preemption after P + 2 tokens,
    resume (row P + 1 on, the first forward of the last sampled token), one more decode.
    ``rerouted``: the re-prefill's rows of the context, emitted again before the resumed ones."""
    resumed = rows[P + 1 : P + 2]
    if rerouted is not None:
        resumed = np.concatenate([rerouted, resumed])
    return [
        ([20], rows[:P], False),
        ([21], rows[P : P + 1], False),
        ([], None, True),
        ([22], resumed, False),
        ([23], rows[P + 2 :], False),
    ]


def test_d4_preempted_request_keeps_its_first_pass_rows() -> None:
    rows = distinct_routes(META, P + G - 1).astype(np.uint8)
    out = run_preempted(first_pass_and_resume(rows))
    assert list(out.outputs[0].token_ids) == [20, 21, 22, 23]
    (s,) = decode_vllm_output(out, DecodeOptions(meta=META))
    assert s is not None
    assert s.routes_TLK.shape[0] == P + G
    np.testing.assert_array_equal(s.routes_TLK[:-1], rows)
    assert s.valid_T[:-1].all()
    assert not s.valid_T[-1]
    validate_samples([s], META)


def test_d4_re_emitted_context_rows_are_refused() -> None:
    rows = distinct_routes(META, P + G - 1).astype(np.uint8)
    rerouted = distinct_routes(META, P + 1, seed=7).astype(np.uint8)  # the re-prefill's rows
    out = run_preempted(first_pass_and_resume(rows, rerouted))
    assert out.outputs[0].routed_experts.shape[0] == P + G - 1 + P + 1
    with pytest.raises(AlignmentError, match=rf"N={P + G - 1 + P + 1} route rows for T={P + G}"):
        list(decode_vllm_output(out, DecodeOptions(meta=META)))
