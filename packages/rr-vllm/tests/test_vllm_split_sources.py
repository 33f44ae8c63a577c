"""Split deployments and configuration sources that read as "not split" or "nothing known"
on vLLM 0.33's own EngineArgs, KVTransferConfig and RequestOutput where vllm imports.

vLLM's NixlConnector replicas run with ``kv_role="kv_both"``: the side each request is on comes
from its transfer parameters. The prefill replica's answer carries ``kv_transfer_params`` with
``do_remote_prefill: true`` (the connector's ``request_finished`` on the node that ran the
prompt, telling the decode replica to pull its KV cache); the decode replica's carries none or
``do_remote_decode: true``."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from rr_fakes.emulations.engines import sglang_server_info, vllm_http_response, vllm_request_output
from rr_vllm import (
    CaptureError,
    DecodeOptions,
    EngineOutputError,
    decode_vllm_http,
    decode_vllm_output,
    merge_split_routes,
    sglang_engine_config,
    vllm_engine_config,
)
from vllm_testing import META, distinct_routes

P, G = 6, 4
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed"
)
#: What vLLM's NixlConnector returns from each side (pull_scheduler.request_finished).
PREFILL_ANSWER = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p0"}
DECODE_ANSWER = {"do_remote_prefill": False, "do_remote_decode": True, "remote_engine_id": "d0"}


def answer(prompt_start: int, params: dict[str, Any] | None, seed: int) -> Any:
    routes = distinct_routes(META, P + G - 1, seed=seed)[prompt_start:]
    out = vllm_request_output(
        "0.32+",
        prompt_ids=range(P),
        generated_ids=range(G),
        routes_TLK=distinct_routes(META, P + G - 1, seed=seed),
        num_experts=8,
        prompt_start=prompt_start,
    )
    out.kv_transfer_params = params
    assert out.outputs[0].routed_experts.shape[0] == routes.shape[0]
    return out


def nixl(role: str) -> dict[str, Any]:
    return {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": role}}


@pytest.mark.parametrize("role", ["kv_both", "KV_BOTH", "kv-both", "both"])
def test_a_kv_both_replica_is_split_and_its_decode_side_prompt_rows_are_refused(role: str) -> None:
    config = vllm_engine_config(nixl(role), vllm_version="0.33.0")
    assert config.disaggregation == "both"
    for params in (None, DECODE_ANSWER, {}):
        with pytest.raises(CaptureError, match=r"kv_both.*D8"):
            list(
                decode_vllm_output(
                    answer(0, params, seed=1), DecodeOptions(meta=META, engine_config=config)
                )
            )
    # the prefill side's answer says it ran the prompt: its prompt rows are its own
    (prefill,) = decode_vllm_output(
        answer(0, PREFILL_ANSWER, seed=1), DecodeOptions(meta=META, engine_config=config)
    )
    assert prefill is not None
    assert prefill.valid_T[:P].all()
    # the decode side asked for rows from P on, merged with the prefill's: the one sample
    (decode,) = decode_vllm_output(
        answer(P, DECODE_ANSWER, seed=2),
        DecodeOptions(meta=META, engine_config=config, prompt_start=P),
    )
    assert decode is not None
    merged = merge_split_routes(prefill, decode)
    assert (merged.routes_TLK[:P] == prefill.routes_TLK[:P]).all()
    assert (merged.routes_TLK[P:] == decode.routes_TLK[P:]).all()


def test_the_http_answer_of_a_kv_both_replica_says_its_side() -> None:
    config = vllm_engine_config(nixl("kv_both"), vllm_version="0.33.0")
    body = vllm_http_response(answer(0, None, seed=3))
    with pytest.raises(CaptureError, match=r"kv_both.*D8"):
        decode_vllm_http(body, DecodeOptions(meta=META, engine_config=config))
    (sample,) = decode_vllm_http(
        body | {"kv_transfer_params": PREFILL_ANSWER},
        DecodeOptions(meta=META, engine_config=config),
    )
    assert sample is not None
    assert sample.valid_T[: P + G - 1].all()


@pytest.mark.parametrize("role", ["kv_prosumer", None, 3])
def test_a_connector_with_an_unknown_role_is_refused_not_read_as_unsplit(role: object) -> None:
    source = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": role}}
    with pytest.raises(CaptureError, match=r"kv_role.*unknown"):
        vllm_engine_config(source, vllm_version="0.33.0")


@needs_vllm
def test_vllm_engine_args_with_nixl_kv_both_read_as_split() -> None:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    kv = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")
    assert kv.is_kv_producer  # vLLM's own reading: either side
    assert kv.is_kv_consumer
    for source in (EngineArgs(model="unused", kv_transfer_config=kv), {"kv_transfer_config": kv}):
        config = vllm_engine_config(source, vllm_version="0.33.0")
        assert config.disaggregation == "both"
        assert config.provenance()["disaggregation"] == "both"


@needs_vllm
def test_vllm_cli_json_text_of_nested_settings_is_parsed() -> None:
    from vllm.engine.arg_utils import EngineArgs

    spec = json.dumps({"method": "eagle3", "model": "draft", "num_speculative_tokens": 3})
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    args = EngineArgs(model="unused", speculative_config=spec, kv_transfer_config=kv)  # type: ignore[arg-type]
    config = vllm_engine_config(args, vllm_version="0.33.0")
    assert config.speculative_mode == "eagle3 tokens=3"
    assert config.provenance()["speculative"] == "eagle3 tokens=3"
    assert config.disaggregation == "both"
    with pytest.raises(CaptureError, match="speculative_config is JSON text of a list"):
        vllm_engine_config({"speculative_config": "[1, 2]"}, vllm_version="0.33.0")


def test_sglang_server_info_as_json_text_is_parsed_and_checked() -> None:
    body = sglang_server_info("0.5.12", speculative_algorithm="NGRAM")
    with pytest.raises(CaptureError, match="NGRAM"):
        sglang_engine_config(json.dumps(body))  # resp.text, not resp.json()
    plain = sglang_engine_config(json.dumps(sglang_server_info("0.5.12", dtype="bfloat16")))
    assert plain.routing_precision == "bfloat16"


@pytest.mark.parametrize(
    ("source", "named"),
    [
        (None, "NoneType"),
        (b'{"speculative_algorithm": "NGRAM"}', r"bytes \(decode the body"),
        ([("speculative_algorithm", "NGRAM")], "list"),
        (8192, "int"),
        ("not json", "str that is not JSON"),
        ('["NGRAM"]', "JSON text of a list"),
    ],
)
@pytest.mark.parametrize("reader", ["sglang", "vllm"])
def test_a_config_source_of_the_wrong_type_is_refused_by_name(
    source: object, named: str, reader: str
) -> None:
    read = sglang_engine_config if reader == "sglang" else vllm_engine_config
    with pytest.raises(CaptureError, match=rf"{reader}_engine_config's source .*{named}"):
        read(source, **({} if reader == "sglang" else {"vllm_version": "0.33.0"}))


def split_pair() -> tuple[Any, Any]:
    """The two samples of one split request: the prefill replica's (rows of the prompt and its
    one sampled token) and the decode replica's (rows from P on)."""
    routes = distinct_routes(META, P + G - 1, seed=5)
    prefill_out = vllm_request_output(
        "0.32+", prompt_ids=range(P), generated_ids=[0], routes_TLK=routes[:P], num_experts=8
    )
    decode_out = vllm_request_output(
        "0.32+",
        prompt_ids=range(P),
        generated_ids=range(G),
        routes_TLK=routes,
        num_experts=8,
        prompt_start=P,
    )
    (prefill,) = decode_vllm_output(prefill_out, DecodeOptions(meta=META))
    (decode,) = decode_vllm_output(decode_out, DecodeOptions(meta=META, prompt_start=P))
    return prefill, decode


def test_merge_split_routes_refuses_the_samples_swapped() -> None:
    prefill, decode = split_pair()
    merged = merge_split_routes(prefill, decode)
    assert merged.valid_T[: P + G - 1].all()
    assert merged.routes_TLK.shape[0] == P + G
    with pytest.raises(EngineOutputError, match=r"passed as prefill has no prompt rows.*swapped"):
        merge_split_routes(decode, prefill)
    # the decode replica's sample decoded from 0 (its prompt rows unread, but present)
    (decode_from_0,) = decode_vllm_output(
        vllm_request_output(
            "0.32+",
            prompt_ids=range(P),
            generated_ids=range(G),
            routes_TLK=distinct_routes(META, P + G - 1, seed=6),
            num_experts=8,
        ),
        DecodeOptions(meta=META),
    )
    with pytest.raises(EngineOutputError, match=r"passed as decode has 7 tokens.*swapped"):
        merge_split_routes(decode_from_0, prefill)
