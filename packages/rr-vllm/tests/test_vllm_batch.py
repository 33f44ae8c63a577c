"""decode_vllm_output(...).to_batch() gives what decoding each output and validate_samples
give: the same batch, or the same error, for every era, fault and prompt_start, on its one-copy
path and off it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rr_core import RouteBatch, RouteMeta
from rr_fakes.emulations.engines import Faults, VllmEra
from rr_vllm import DecodeOptions, decode_vllm_output, validate_samples
from rr_vllm.options import compact_dtype
from rr_vllm.vllm.decode import _direct, read_request
from vllm_testing import distinct_routes, fake_vllm_output, make_meta

K = 2


def outputs(
    era: VllmEra, meta: RouteMeta, *, prompt_start: int = 0, faults: dict[int, Faults] | None = None
) -> list[Any]:
    """Five requests of different lengths; ``faults`` by request index."""
    out = []
    for i, (p, g) in enumerate([(5, 4), (3, 1), (7, 6), (4, 9), (6, 2)]):
        ids = distinct_routes(meta, p + g - 1, seed=i)
        out.append(
            fake_vllm_output(
                era,
                meta,
                ids,
                p,
                g,
                prompt_start=min(prompt_start, p) if era.has_prompt_start else 0,
                request_id=str(i),
                faults=(faults or {}).get(i, Faults()),
            )
        )
    return out


def reference(request_outputs: list[Any], meta: RouteMeta, **kw: Any) -> RouteBatch:
    ps = kw.pop("prompt_start", 0)
    samples = [
        s
        for r in request_outputs
        for s in decode_vllm_output(r, DecodeOptions(meta=meta, prompt_start=ps))
    ]
    return validate_samples(samples, meta, **kw)


def same_outcome(call: Callable[[], RouteBatch], ref: Callable[[], RouteBatch]) -> None:
    try:
        expected: RouteBatch | Exception = ref()
    except Exception as e:  # the same type and message, whatever it is
        expected = e
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)) as got:
            call()
        assert str(got.value) == str(expected)
        return
    assert call().equal(expected)


@pytest.mark.parametrize("era", list(VllmEra))
@pytest.mark.parametrize("num_experts", [8, 300])
@pytest.mark.parametrize("prompt_start", [0, 2])
def test_clean_batches_match(era: VllmEra, num_experts: int, prompt_start: int) -> None:
    meta = make_meta(num_experts, dense=(1,))
    outs = outputs(era, meta, prompt_start=prompt_start)
    direct = era.has_prompt_start and num_experts <= 256  # 0.22+ returns uint8 up to 256
    assert _direct([read_request(o) for o in outs], compact_dtype(num_experts)) == direct
    same_outcome(
        lambda: decode_vllm_output(
            outs, DecodeOptions(meta=meta, prompt_start=prompt_start)
        ).to_batch(),
        lambda: reference(outs, meta, prompt_start=prompt_start),
    )


FAULTS = {
    "all_zero": Faults(all_zero=True),
    "physical": Faults(physical_map=np.arange(8)[::-1] + 2),
    "draft_layer0": Faults(draft_layer0=3),
    "aborted": Faults(abort_after_rows=2),
    "missing": Faults(missing=True),
    "read_only": Faults(read_only=True),
}


@pytest.mark.parametrize("era", [VllmEra.V0_14, VllmEra.V0_22, VllmEra.V0_32])
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("where", [0, 3])
def test_faulty_batches_give_the_same_error_or_batch(era: VllmEra, fault: str, where: int) -> None:
    meta = make_meta(8)
    outs = outputs(era, meta, faults={where: FAULTS[fault]})
    same_outcome(
        lambda: decode_vllm_output(outs, DecodeOptions(meta=meta)).to_batch(),
        lambda: reference(outs, meta),
    )
    kw = {"allow_all_zero": True, "logical_experts": 8}
    same_outcome(
        lambda: decode_vllm_output(outs, DecodeOptions(meta=meta, **kw)).to_batch(),
        lambda: reference(outs, meta, **kw),
    )


def test_aborted_rows_are_invalid_and_the_rest_is_in_place() -> None:
    meta = make_meta(8)
    outs = outputs(VllmEra.V0_22, meta, faults={1: FAULTS["aborted"]})
    batch = decode_vllm_output(outs, DecodeOptions(meta=meta)).to_batch()
    lengths = batch.lengths.tolist()
    assert lengths == [9, 4, 13, 13, 8]
    first, second = batch.offsets_B1[1:3].tolist()
    assert not batch.valid_N[first:second].any()  # the aborted request: masked, not dropped
    rows = outs[2].outputs[0].routed_experts
    start = batch.offsets_B1[2].item()
    assert np.array_equal(batch.values_NLK[start : start + len(rows)].numpy(), rows)


def test_moe_layers_meta_is_refused() -> None:
    meta = RouteMeta(num_experts=8, top_k=K, layer_axis="moe_layers", layer_numbers=(1, 2, 3, 4))
    with pytest.raises(Exception, match="all_layers"):
        decode_vllm_output([], DecodeOptions(meta=meta)).to_batch()


@pytest.mark.parametrize("era", [VllmEra.V0_22, VllmEra.V0_32])
@pytest.mark.parametrize("fault", ["none", "aborted", "read_only"])
@pytest.mark.parametrize("prompt_start", [0, 2])
def test_a_batch_in_a_dropped_batchs_memory_equals_a_fresh_one(
    era: VllmEra, fault: str, prompt_start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-copy path decodes into recycled memory: every byte the samples do not write (rows
    before prompt_start, the last token's row, aborted requests) must still come out zero."""
    from rr_core import buffers

    monkeypatch.setattr(buffers, "MIN_RECYCLED_BYTES", 0)  # these batches are tiny
    meta = make_meta(8, dense=(1,))
    faults = {} if fault == "none" else {2: FAULTS[fault]}
    outs = outputs(era, meta, prompt_start=prompt_start, faults=faults)
    first = decode_vllm_output(outs, DecodeOptions(meta=meta, prompt_start=prompt_start)).to_batch()
    first.values_NLK.fill_(0xFF)  # the memory the next batch reuses, dirty everywhere
    address = first.values_NLK.data_ptr()
    del first
    again = decode_vllm_output(outs, DecodeOptions(meta=meta, prompt_start=prompt_start)).to_batch()
    assert again.values_NLK.data_ptr() == address  # the dropped batch's memory, reused
    assert again.equal(reference(outs, meta, prompt_start=prompt_start))
    held = decode_vllm_output(outs, DecodeOptions(meta=meta, prompt_start=prompt_start)).to_batch()
    assert held.values_NLK.data_ptr() != again.values_NLK.data_ptr()  # a live batch is kept
    assert again.equal(held)
