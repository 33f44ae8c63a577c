"""Engine configurations that corrupt routes are refused by name (E7, E8, E9); a decode
replica's prompt rows are refused unless merged (D8); the merge of a split deployment; the
configuration as record provenance; SGLang's narrow-id wire field; trajectories whose ids cross
255 mid-way and step-wise trajectories."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rr_core import load_routes, read_header, save_routes
from rr_fakes.emulations.engines import sglang_response, sglang_server_info, vllm_request_output
from rr_fakes.emulations.engines._stream import vllm_generate_stream
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineConfig,
    EngineOutputError,
    SampleRoutes,
    Trajectory,
    decode_routes_array,
    decode_sglang,
    decode_vllm_output,
    decode_vllm_stream,
    merge_split_routes,
    sglang_engine_config,
    validate_samples,
    vllm_engine_config,
)
from vllm_testing import META, distinct_routes, make_meta, streamed_output

P, G = 6, 4


@pytest.mark.parametrize("namespaced", [False, True])
def test_sglang_defaults_are_accepted_and_read(namespaced: bool) -> None:
    info = sglang_server_info(namespaced=namespaced, dtype="bfloat16", disable_radix_cache=True)
    config = sglang_engine_config(info)
    assert config.version == "0.5.23"
    assert config.speculative is None
    assert config.prefix_caching is False
    assert config.chunked_prefill_size == 8192
    assert config.routing_precision == "bfloat16"
    assert config.disaggregation == "none"


@pytest.mark.parametrize(
    ("settings", "code", "named"),
    [
        ({"speculative_algorithm": "NGRAM"}, "E7", "NGRAM"),
        ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4}, "E7", "topk=4"),
        ({"speculative_algorithm": "eagle3", "speculative_eagle_topk": 2}, "E7", "EAGLE3"),
        ({"speculative_algorithm": "NEXTN", "speculative_eagle_topk": 8}, "E7", "NEXTN"),
        ({"enable_hierarchical_cache": True}, "E8", "enable_hierarchical_cache"),
        ({"chunked_prefill_size": -1}, "E9", "chunked_prefill_size=-1"),
    ],
)
@pytest.mark.parametrize("version", ["0.5.7", "0.5.12", "0.5.23"])
def test_sglang_configurations_that_corrupt_routes_are_refused(
    settings: dict[str, Any], code: str, named: str, version: str
) -> None:
    info = sglang_server_info(version, namespaced=version == "0.5.23", **settings)
    with pytest.raises(CaptureError, match=rf"SGLang {version} .*{named}.*`rr explain {code}`"):
        sglang_engine_config(info)
    # The same configuration given by hand (no release known) is refused too.
    with pytest.raises(CaptureError, match=rf"`rr explain {code}`"):
        sglang_engine_config({k: v for k, v in info.items() if k != "version"})


def test_sglang_single_path_drafting_is_accepted_and_recorded() -> None:
    info = sglang_server_info(
        speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_num_draft_tokens=4
    )
    config = sglang_engine_config(info)
    assert config.speculative_mode == "EAGLE topk=1 tokens=4"
    assert config.provenance("int32")["speculative"] == "EAGLE topk=1 tokens=4"


def test_decode_options_refuse_a_corrupting_configuration_built_by_hand() -> None:
    bad = EngineConfig(engine="sglang", version="0.5.23", hierarchical_cache=True)
    with pytest.raises(CaptureError, match="E8"):
        DecodeOptions(meta=META, engine_config=bad)
    routes = distinct_routes(META, P + G - 1)
    answer = sglang_response(prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes)
    with pytest.raises(CaptureError, match="E8"):
        decode_sglang(answer, DecodeOptions(meta=META, engine_config=bad)).only()
    with pytest.raises(CaptureError, match="speculative_topk must be int"):
        EngineConfig(engine="sglang", speculative_topk="4")  # type: ignore[arg-type]


def _decode_replica_sglang() -> EngineConfig:
    return sglang_engine_config(sglang_server_info(disaggregation_mode="decode"))


def test_decode_replica_prompt_rows_are_refused_unless_merged() -> None:
    routes = distinct_routes(META, P + G - 1, seed=1)
    answer = sglang_response(prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes)
    config = _decode_replica_sglang()
    with pytest.raises(CaptureError, match=r"rows 0\.\.5 are the prompt's.*`rr explain D8`"):
        decode_sglang(answer, DecodeOptions(meta=META, engine_config=config)).only()
    # Rows from P on are the decode replica's own.
    late = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, start_len=P
    )
    sample = decode_sglang(
        late, DecodeOptions(meta=META, engine_config=config, prompt_start=P)
    ).only()
    assert sample is not None
    assert sample.valid_T.tolist() == [False] * P + [True] * (G - 1) + [False]
    # A router that spliced the prefill rows in already: the answer is whole.
    merged = sglang_engine_config(
        sglang_server_info(disaggregation_mode="decode"), prompt_rows_merged=True
    )
    whole = decode_sglang(answer, DecodeOptions(meta=META, engine_config=merged)).only()
    assert whole is not None
    np.testing.assert_array_equal(whole.routes_TLK[: P + G - 1], routes)


def _samples(seed: int = 2, *, stale: bool = True) -> tuple[Any, Any, np.ndarray]:
    """The prefill replica's sample (prompt + its one sampled token) and the decode replica's
    (rows from P, or from 0 with stale prompt rows), and the true rows of the request."""
    truth = distinct_routes(META, P + G - 1, seed=seed)
    prefill = decode_routes_array(
        truth[:P],
        DecodeOptions(meta=META),
        num_prompt_tokens=P,
        num_generated_tokens=1,
        finish_reason="length",
    ).only()
    if stale:
        rows = truth.copy()
        rows[:P] = distinct_routes(META, P, seed=seed + 10)  # whatever the buffer held
        decode = decode_routes_array(
            rows, DecodeOptions(meta=META), num_prompt_tokens=P, num_generated_tokens=G
        ).only()
    else:
        decode = decode_routes_array(
            truth[P:],
            DecodeOptions(meta=META, prompt_start=P),
            num_prompt_tokens=P,
            num_generated_tokens=G,
        ).only()
    return prefill, decode, truth


@pytest.mark.parametrize("stale", [True, False])
def test_merge_split_routes_joins_prefill_prompt_rows_and_decode_rows(stale: bool) -> None:
    prefill, decode, truth = _samples(stale=stale)
    merged = merge_split_routes(prefill, decode)
    assert merged.routes_TLK.shape == (P + G, 4, 2)
    np.testing.assert_array_equal(merged.routes_TLK[: P + G - 1], truth)
    assert merged.valid_T.tolist() == [True] * (P + G - 1) + [False]
    batch = validate_samples([merged], META)
    assert batch.num_tokens == P + G


def prefill_rows(rows: np.ndarray, p: int) -> SampleRoutes | None:
    """A prefill replica's sample: P prompt tokens, the one token it generates, and its rows."""
    options = DecodeOptions(meta=META)
    return decode_routes_array(rows, options, num_prompt_tokens=p, num_generated_tokens=1).only()


def test_merge_split_routes_checks_lengths_dtypes_and_coverage() -> None:
    prefill, decode, truth = _samples(stale=False)
    other = prefill_rows(truth[: P - 1], P - 1)
    with pytest.raises(EngineOutputError, match="5 prompt tokens, the decode replica's 6"):
        merge_split_routes(other, decode)
    narrow = prefill_rows(truth[:P].astype(np.uint8), P)
    with pytest.raises(EngineOutputError, match="prefill ids are uint8, decode ids int64"):
        merge_split_routes(narrow, decode)
    wide = make_meta(dense=(1,), top_k=3)
    three = decode_routes_array(
        distinct_routes(wide, P),
        DecodeOptions(meta=wide),
        num_prompt_tokens=P,
        num_generated_tokens=1,
    ).only()
    with pytest.raises(EngineOutputError, match=r"prefill rows are \[4, 3\].*decode rows \[4, 2\]"):
        merge_split_routes(three, decode)
    late = decode_routes_array(
        truth[2:P],
        DecodeOptions(meta=META, prompt_start=2),
        num_prompt_tokens=P,
        num_generated_tokens=1,
    ).only()
    merged = merge_split_routes(late, decode)  # rows from 2 are whole from there
    assert merged.valid_T[:P].tolist() == [False, False, True, True, True, True]
    with pytest.raises(EngineOutputError, match="must be a SampleRoutes"):
        merge_split_routes(truth, decode)  # type: ignore[arg-type]
    gap = decode_routes_array(
        truth[P + 1 :],
        DecodeOptions(meta=META, prompt_start=P + 1),
        num_prompt_tokens=P,
        num_generated_tokens=G,
    ).only()
    with pytest.raises(EngineOutputError, match="no row for token 6"):
        merge_split_routes(prefill, gap)


def test_a_streamed_decode_replica_answer_merges() -> None:
    out, truth = streamed_output(P, G, start=P, seed=4)
    config = EngineConfig(engine="vllm", version="0.33.0", disaggregation="decode")
    (decode,) = decode_vllm_stream(
        vllm_generate_stream(out, chunk_tokens=2, include_usage=True),
        DecodeOptions(meta=META, prompt_start=P, engine_config=config),
    )
    assert decode.routes_TLK.dtype == np.uint8  # 0.32+ sends compact ids
    prefill = prefill_rows(truth[:P].astype(np.uint8), P)
    merged = merge_split_routes(prefill, decode)
    np.testing.assert_array_equal(merged.routes_TLK[: P + G - 1], truth)
    stale, _ = streamed_output(P, G, seed=4)  # the same answer, sent without prompt_start
    with pytest.raises(CaptureError, match="D8"):
        decode_vllm_stream(
            vllm_generate_stream(stale, chunk_tokens=2, include_usage=True),
            DecodeOptions(meta=META, engine_config=config),
        )


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed"
)


@needs_vllm
def test_real_vllm_engine_args_are_read() -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    args = arg_utils.EngineArgs(
        model="unused",
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        enable_prefix_caching=True,
        kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
        dtype="bfloat16",
    )
    config = vllm_engine_config(args, vllm_version="0.33.0")
    assert config.speculative_mode == "ngram tokens=3"
    assert config.prefix_caching is True
    assert config.disaggregation == "decode"
    assert config.routing_precision == "bfloat16"
    plain = vllm_engine_config(arg_utils.EngineArgs(model="unused"), vllm_version="0.33.0")
    assert plain.speculative is None
    assert plain.disaggregation == "none"
    routes = distinct_routes(META, P + G - 1, seed=6)
    out = vllm_request_output(
        "0.32+", prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, num_experts=8
    )
    with pytest.raises(CaptureError, match=r"decode replica of a prefill/decode split \(vllm\)"):
        list(decode_vllm_output(out, DecodeOptions(meta=META, engine_config=config)))


@needs_vllm
def test_real_vllm_config_objects_are_read() -> None:
    config_module = pytest.importorskip("vllm.config")
    kv = config_module.KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_producer")
    spec = config_module.SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1
    )
    source = {"kv_transfer_config": kv, "speculative_config": spec}
    config = vllm_engine_config(source, vllm_version="0.33.0")
    assert config.disaggregation == "prefill"
    assert config.speculative_mode == "ngram tokens=3"
    assert config.provenance("uint8")["speculative"] == "ngram tokens=3"


def test_provenance_is_stored_with_the_routes(tmp_path: Path) -> None:
    config = sglang_engine_config(sglang_server_info("0.5.12", dtype="bfloat16"))
    routes = distinct_routes(META, P + G - 1, seed=7)
    answer = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, sglang_version="0.5.12"
    )
    sample = decode_sglang(
        answer, DecodeOptions(meta=META, engine_config=config, engine_version="0.5.12")
    ).only()
    batch = validate_samples([sample], META)
    path = save_routes(tmp_path / "r.rr", batch, provenance=config.provenance("int32"))
    assert read_header(path).provenance == {
        "engine": "sglang",
        "engine_version": "0.5.12",
        "routing_precision": "bfloat16",
        "speculative": "none",
        "prefix_caching": True,
        "id_dtype": "int32",
        "disaggregation": "none",
        "hierarchical_cache": False,
    }
    assert load_routes(path).equal(batch)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_sglang_routed_experts_dtype_is_read_when_present(dtype: str) -> None:
    meta = make_meta(num_experts=300 if dtype == "uint16" else 8, dense=(1,))
    routes = distinct_routes(meta, P + G - 1, seed=8)
    answer = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, wire_dtype=dtype
    )
    sample = decode_sglang(answer, DecodeOptions(meta=meta)).only()
    assert sample is not None
    assert sample.routes_TLK.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(sample.routes_TLK[: P + G - 1], routes)
    # Without the field the same narrow bytes are named as a re-encoding, never misread.
    del answer["meta_info"]["routed_experts_dtype"]
    if dtype != "int32":
        with pytest.raises(EngineOutputError, match=r"(uint8|int16), where SGLang sends int32"):
            decode_sglang(answer, DecodeOptions(meta=meta)).only()


def test_an_unknown_routed_experts_dtype_is_refused() -> None:
    routes = distinct_routes(META, P + G - 1)
    answer = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, wire_dtype="uint8"
    )
    answer["meta_info"]["routed_experts_dtype"] = "float16"
    with pytest.raises(EngineOutputError, match="routed_experts_dtype'] is 'float16'"):
        decode_sglang(answer, DecodeOptions(meta=META)).only()


def _turn(routes: np.ndarray, dtype: str) -> np.ndarray:
    return routes.astype(dtype)


def test_a_trajectory_whose_ids_cross_255_mid_way_keeps_every_id() -> None:
    """Per-turn compaction: turn 1's ids fit uint8, turn 2's do not (uint16); the stitched
    routes hold every id exactly (SkyRL #1912 wrapped them)."""
    meta = make_meta(num_experts=512, dense=(1,))
    trajectory = Trajectory(meta, num_prompt_tokens=3, vllm_version="0.33.0")
    low = distinct_routes(make_meta(num_experts=256, dense=(1,)), 4, seed=1)
    turn1 = [1, 2, 3]
    trajectory.add_turn(turn1, [4, 5], _turn(low, "uint8"), prompt_start=0)
    high = distinct_routes(make_meta(num_experts=256, dense=(1,)), 2, seed=2)
    high[:, 1:] += 256  # every MoE id in 256..511
    turn2 = [1, 2, 3, 4, 5, 6]
    start = trajectory.prompt_start(turn2)
    trajectory.add_turn(turn2, [7], _turn(high, "uint16"), prompt_start=start)
    sample = trajectory.routes()
    assert sample.routes_TLK.dtype.itemsize >= 2
    np.testing.assert_array_equal(sample.routes_TLK[:4], low)
    np.testing.assert_array_equal(sample.routes_TLK[4:6], high)
    batch = validate_samples([sample], meta)
    assert int(batch.values_NLK.max()) == int(high.max())


def test_a_step_wise_trajectory_finalizes() -> None:
    """Step-wise: each step is a turn of one generated token; the trajectory finalizes into one
    sample with every step's row (SkyRL #2080 crashed here)."""
    trajectory = Trajectory(META, num_prompt_tokens=2, vllm_version="0.33.0")
    truth = distinct_routes(META, 7, seed=9)
    tokens = [10, 11]
    for step in range(6):
        start = trajectory.prompt_start(tokens)
        rows = truth[start : len(tokens)]
        trajectory.add_turn(list(tokens), [20 + step], rows, prompt_start=start)
        tokens = [*tokens, 20 + step]
    sample = trajectory.routes()
    assert sample.routes_TLK.shape[0] == len(tokens)
    np.testing.assert_array_equal(sample.routes_TLK[: len(tokens) - 1], truth[: len(tokens) - 1])
    assert validate_samples([sample], META).num_tokens == len(tokens)


def test_capture_helpers_refuse_a_corrupting_configuration_before_any_request() -> None:
    from rr_vllm import ModelGeometry, sglang_request_fields, vllm_engine_args

    lengths = {"prompt_length": 8, "response_length": 8, "max_model_len": 32}
    info = sglang_server_info(speculative_algorithm="EAGLE", speculative_eagle_topk=4)
    with pytest.raises(CaptureError, match="E7"):
        sglang_request_fields(4, server_info=info, **lengths)
    with pytest.raises(CaptureError, match="E9"):
        sglang_request_fields(
            4, server_info=EngineConfig(engine="sglang", chunked_prefill_size=-1), **lengths
        )
    ok = sglang_request_fields(4, server_info=sglang_server_info(), **lengths)
    assert ok["return_routed_experts"] is True
    geometry = ModelGeometry(num_hidden_layers=4, num_experts=8, top_k=2)
    no_cache = EngineConfig(engine="vllm", version="0.33.0", prefix_caching=False)
    with pytest.raises(CaptureError, match="requires prefix caching"):
        vllm_engine_args(geometry, vllm_version="0.33.0", engine_config=no_cache)


def test_sglang_streams_of_a_decode_replica_are_never_merged() -> None:
    """SGLang's PD path splices the prefill rows into non-streamed answers only (#22916):
    prompt_rows_merged=True lets the non-streamed answer through, never the streamed one."""
    from rr_fakes.emulations.engines._wire import sglang_openai_stream
    from rr_vllm import decode_sglang_stream

    routes = distinct_routes(META, P + G - 1, seed=11)
    item = sglang_response(prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes)
    merged = sglang_engine_config(
        sglang_server_info(disaggregation_mode="decode"), prompt_rows_merged=True
    )
    assert decode_sglang(item, DecodeOptions(meta=META, engine_config=merged)).only() is not None
    with pytest.raises(CaptureError, match="D8"):
        decode_sglang_stream(
            sglang_openai_stream(item), DecodeOptions(meta=META, engine_config=merged)
        ).only()
    late = sglang_response(
        prompt_ids=range(P), generated_ids=range(G), routes_TLK=routes, start_len=P
    )
    sample = decode_sglang_stream(
        sglang_openai_stream(late), DecodeOptions(meta=META, engine_config=merged, prompt_start=P)
    ).only()
    assert sample is not None
    assert sample.valid_T[P : P + G - 1].all()


def test_a_whole_batch_of_a_decode_replica_is_refused_unless_rows_start_at_the_prompt() -> None:

    config = EngineConfig(engine="vllm", version="0.33.0", disaggregation="decode")
    whole, _ = streamed_output(P, G, seed=12)
    with pytest.raises(CaptureError, match="D8"):
        decode_vllm_output([whole], DecodeOptions(meta=META, engine_config=config)).to_batch()
    options = DecodeOptions(meta=META, engine_config=config, prompt_start=P)
    batch = decode_vllm_output([streamed_output(P, G, start=P, seed=12)[0]], options).to_batch()
    assert batch.valid_N.tolist() == [False] * P + [True] * (G - 1) + [False]
