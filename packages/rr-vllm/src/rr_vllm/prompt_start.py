"""The ``routed_experts_prompt_start`` that is safe to send, and dropping the rows it adds (G4).

vLLM 0.22.0-0.29.x assert ``prompt_start < P`` in the scheduler, so a request asking for no
prompt rows at all (``prompt_start == P``) kills the EngineCore and every later request answers
HTTP 500 (vLLM #55750; fixed by PR #56844 in 0.30.0). On those releases ``P - 1`` is sent
instead: the engine then returns one more row, the route of the last prompt token, which vLLM
always recomputes (a prefix-cache hit never covers the last prompt token), so the row is a real
route of this request and the caller's rows from ``P`` on are exactly the ones it asked for.
Decode with the start that was sent (``fields["routed_experts_prompt_start"]``); a decode with
``P`` sees ``T - P`` rows, one more than the contract's ``T - P - 1``, and raises rather than
read them one token late.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rr_core.checks import check_instance
from rr_vllm.errors import CaptureError
from rr_vllm.fields import integer
from rr_vllm.releases import VllmFlags
from rr_vllm.samples import SampleRoutes, check_sample


def prompt_start_to_send(prompt_start: int, num_prompt_tokens: int, flags: VllmFlags) -> int:
    """``prompt_start``, or ``P - 1`` where it is ``P`` on a release whose EngineCore dies on
    it. Outside ``0..P``, or non-zero on a release without the knob, raises
    :class:`~rr_vllm.CaptureError`."""
    p = integer(num_prompt_tokens, "num_prompt_tokens", error=CaptureError)
    start = integer(prompt_start, "prompt_start", error=CaptureError, minimum=None)
    takes = "prompt_start_to_send takes the VllmFlags of the engine (vllm_flags(version))"
    flags = check_instance(flags, VllmFlags, CaptureError, takes)
    if not 0 <= start <= p:
        raise CaptureError(
            f"prompt_start={start} is outside 0..P={p} (vLLM answers HTTP 400 from 0.30; "
            "0.22-0.29 accept it and their EngineCore dies)"
        )
    if not flags.prompt_start:
        if start:
            raise CaptureError(
                f"vLLM {flags.version} has no routed_experts_prompt_start (it arrived in 0.22); "
                f"got prompt_start={start}: pass 0 and drop rows after decoding"
            )
        return 0
    if start == p > 0 and not flags.prompt_start_whole_prompt:
        return p - 1  # G4: vLLM #55750
    return start


def drop_rows_before(sample: SampleRoutes, prompt_start: int) -> SampleRoutes:
    """The sample with the rows of tokens before ``prompt_start`` invalid (zeroed), as if the
    engine had skipped them: the row that :func:`prompt_start_to_send` adds on 0.22-0.29, or
    rows the caller already holds. The arrays are copied only when rows change."""
    sample = check_sample(sample, "drop_rows_before's sample", CaptureError)
    start = integer(prompt_start, "prompt_start", error=CaptureError)
    t = sample.routes_TLK.shape[0]
    if start > sample.num_prompt_tokens:
        raise CaptureError(
            f"prompt_start={start} is past the prompt (P={sample.num_prompt_tokens}, {t} tokens): "
            "drop_rows_before drops prompt rows only"
        )
    if start <= sample.prompt_start and not sample.valid_T[:start].any():
        return sample
    routes_TLK, valid_T = np.array(sample.routes_TLK), np.array(sample.valid_T)
    routes_TLK[:start] = 0
    valid_T[:start] = False
    return dataclasses.replace(
        sample, routes_TLK=routes_TLK, valid_T=valid_T, prompt_start=max(start, sample.prompt_start)
    )
