"""The SGLang decoders against the installed sglang wheel (installed without its CUDA
dependencies, on CPU torch): the OpenAI-compatible response classes of
``sglang.srt.entrypoints.openai.protocol`` serialised as the server sends them, SGLang's own
encoder (the detokenizer's) and client helper ``extract_routed_experts_from_meta_info``, and the
request fields. The rest of ``sglang.srt`` needs a CUDA torchvision on import, so the encoder, the
helper and the request dataclass are read from the wheel's source (``ast``) and the helper and
encoder run as written there. Skipped where sglang is not installed."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pybase64
import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed", allow_module_level=True)
ROOT = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]).parent  # type: ignore[index, union-attr]


def _load_protocol() -> Any:
    """The wheel's protocol module, loaded from its file with sglang/utils.py and the packages
    above them stood in for: ``import sglang`` runs sglang/__init__.py, which needs triton and
    (0.5.11-0.5.21, sglang/srt/utils/common.py) torchvision, CUDA-only wheels on PyPI; the
    protocol module needs only pydantic, openai, sglang/utils.py and sglang/srt/environ.py."""
    name = "sglang.srt.entrypoints.openai.protocol"
    if "sglang" in sys.modules:  # imported for real already
        return importlib.import_module(name)
    parts = name.split(".")
    for i in range(1, len(parts)):  # the packages above, without running their __init__.py
        package = types.ModuleType(".".join(parts[:i]))
        package.__path__ = [str(ROOT.joinpath(*parts[:i]))]
        sys.modules[package.__name__] = package
    for module in ("sglang.utils", name):
        path = ROOT / (module.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(module, path)
        loaded = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[module] = loaded
        spec.loader.exec_module(loaded)  # type: ignore[union-attr]
    return sys.modules[name]


protocol = _load_protocol()

from rr_fakes.emulations.engines import sglang_response  # noqa: E402
from rr_fakes.emulations.engines._wire import sglang_openai_response, sglang_openai_stream  # noqa: E402
from rr_vllm import (  # noqa: E402
    DecodeOptions,
    decode_sglang,
    decode_sglang_openai,
    decode_sglang_stream,
    sglang_flags,
    sglang_request_fields,
    validate_samples,
)
from rr_vllm._supported import SGLANG_CAPTURER_MODULE, SGLANG_ENCODER  # noqa: E402
from vllm_testing import META, distinct_routes  # noqa: E402

VERSION = importlib.metadata.version("sglang")
FLAGS = sglang_flags(VERSION)
P, G, START = 6, 4, 2
ROUTES = distinct_routes(META, P + G - 1, seed=5)
needs_sglext = pytest.mark.skipif(not FLAGS.openai_sglext, reason="no sglext before 0.5.9")


def _for_release(table: dict[str, str]) -> str:
    release = Version(Version(VERSION).base_version)
    (value,) = [v for spec, v in table.items() if release in SpecifierSet(spec)]
    return value


def _source(module: str) -> tuple[str, ast.Module]:
    path = ROOT / (module.replace(".", "/") + ".py")
    text = path.read_text()
    return text, ast.parse(text)


def _function(module: str, name: str) -> Any:
    """A function of the wheel's ``module``, compiled alone from its source (its module does
    not import here), with the names it uses."""
    _, tree = _source(module)
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    node.decorator_list = []
    scope: dict[str, Any] = {"np": np, "pybase64": pybase64, "torch": torch, "Any": Any}
    scope.update(dict.fromkeys(("List", "Optional", "BatchTokenIDOutput"), Any))
    code = compile(ast.fix_missing_locations(ast.Module([node], [])), module, "exec")
    exec(code, scope)  # the wheel's own code, read from the installed file
    return scope[name]


def _generate(start_len: int = 0) -> dict[str, Any]:
    return sglang_response(
        prompt_ids=list(range(P)),
        generated_ids=list(range(100, 100 + G)),
        routes_TLK=ROUTES,
        start_len=start_len,
        sglang_version=VERSION,
    )


def _rows(start_len: int) -> torch.Tensor:
    """What the scheduler hands the detokenizer: int32 ``[rows, L, K]``."""
    first = start_len if FLAGS.start_len else 0
    return torch.from_numpy(ROUTES[first:].astype(np.int32))


def _sglang_encode(rows: torch.Tensor) -> str:
    """The wheel's own encoding of one request's routes, by the function that does it."""
    release = Version(Version(VERSION).base_version)
    detok = "sglang.srt.managers.detokenizer_manager"
    if release >= Version("0.5.11"):
        (text,) = _function(detok, "_b64_encode_per_request")([rows])
        return str(text)
    if release < Version("0.5.10"):
        field = "output_routed_experts" if release < Version("0.5.8") else "routed_experts"

        class Batch:
            pass

        batch = Batch()
        setattr(batch, field, [rows])
        (text,) = _function(detok, "_extract_routed_experts")(None, batch)
        return str(text)
    # 0.5.10: inline in TokenizerManager; the expression, checked to be the one there
    source, _ = _source("sglang.srt.managers.tokenizer_manager")
    assert (
        "pybase64.b64encode(\n                        routed_experts_tensor.numpy().tobytes()"
        in source
    )
    return pybase64.b64encode(rows.numpy().tobytes()).decode("utf-8")


def test_the_encoder_is_where_the_facts_say() -> None:
    where = _for_release(SGLANG_ENCODER)
    detok, _ = _source("sglang.srt.managers.detokenizer_manager")
    tok, _ = _source("sglang.srt.managers.tokenizer_manager")
    if where.startswith("DetokenizerManager"):
        name = re.match(r"DetokenizerManager\.(\w+)", where).group(1)  # type: ignore[union-attr]
        assert f"def {name}(" in detok
        assert "b64encode" in detok
    else:
        assert "b64encode" not in detok
        assert "b64encode(" in tok
    # the tokenizer manager encodes tensors that skip the detokenizer from 0.5.10 on
    assert ("b64encode" in tok) is (not FLAGS.tensor_without_tokenizer)


@pytest.mark.parametrize("start_len", [0, START])
def test_sglang_encoded_routes_decode(start_len: int) -> None:
    item = _generate(start_len)
    item["meta_info"]["routed_experts"] = _sglang_encode(_rows(start_len))
    s = decode_sglang(
        item, DecodeOptions(meta=META, prompt_start=start_len, engine_version=VERSION)
    ).only()
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[start_len : P + G - 1], ROUTES[start_len:])
    assert s.valid_T.sum() == P + G - 1 - start_len
    validate_samples([s], META)
    # the emulation writes what the wheel writes
    assert _generate(start_len)["meta_info"]["routed_experts"] == _sglang_encode(_rows(start_len))


def test_sglang_client_helper_reads_the_emulated_routes() -> None:
    helper = _function(
        _for_release(SGLANG_CAPTURER_MODULE), "extract_routed_experts_from_meta_info"
    )
    flat = helper(_generate())
    assert flat.dtype == np.int32
    np.testing.assert_array_equal(flat.reshape(ROUTES.shape), ROUTES)


def _request_fields() -> set[str]:
    _, tree = _source("sglang.srt.managers.io_struct")
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput"]
    return {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_request_fields_exist_and_start_len_reaches_the_scheduler() -> None:
    fields = _request_fields()
    body = sglang_request_fields(
        P, prompt_length=8, response_length=16, max_model_len=64, start_len=START
    )
    sent = set(body) - {"sampling_params"}
    if "routed_experts_start_len" in fields:
        assert sent <= fields
    else:  # 0.5.7: the field does not exist (a /generate body ignores it)
        assert sent - fields == {"routed_experts_start_len"}
    tok, _ = _source("sglang.srt.managers.tokenizer_manager")
    assert ("routed_experts_start_len=obj.routed_experts_start_len" in tok) is FLAGS.start_len


# --- OpenAI-compatible classes -------------------------------------------------------------------


def _dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(model.model_dump_json())
    return out


def _usage() -> Any:
    return protocol.UsageInfo(prompt_tokens=P, completion_tokens=G, total_tokens=P + G)


@needs_sglext
@pytest.mark.parametrize("chat", [False, True])
def test_real_openai_response_decodes(chat: bool) -> None:
    item = _generate(START)
    text = item["meta_info"]["routed_experts"]
    ext = protocol.SglExt(routed_experts=text)
    if chat:
        choice = protocol.ChatCompletionResponseChoice(
            index=0,
            message=protocol.ChatMessage(role="assistant", content=""),
            finish_reason="length",
        )
        cls = protocol.ChatCompletionResponse
    else:
        choice = protocol.CompletionResponseChoice(index=0, text="", finish_reason="length")
        cls = protocol.CompletionResponse
    body = _dump(cls(id="0", model="m", choices=[choice], usage=_usage(), sglext=ext))
    fake = sglang_openai_response([item], chat=chat, sglang_version=VERSION)
    assert fake["sglext"] == body["sglext"]
    assert set(fake["choices"][0]) <= set(body["choices"][0])
    assert set(fake) - {"metadata"} <= set(body)
    (s,) = decode_sglang_openai(
        body, DecodeOptions(meta=META, prompt_start=START, engine_version=VERSION)
    )
    (t,) = decode_sglang_openai(
        fake, DecodeOptions(meta=META, prompt_start=START, engine_version=VERSION)
    )
    assert s is not None
    assert t is not None
    np.testing.assert_array_equal(s.routes_TLK, t.routes_TLK)
    np.testing.assert_array_equal(s.valid_T, t.valid_T)


@pytest.mark.skipif(not FLAGS.chat_meta_info, reason="choices[].meta_info arrived in 0.5.13")
def test_real_chat_meta_info_choices_decode() -> None:
    choices = [
        protocol.ChatCompletionResponseChoice(
            index=i,
            message=protocol.ChatMessage(role="assistant", content=""),
            finish_reason="length",
            meta_info=_generate()["meta_info"],
        )
        for i in range(2)
    ]
    body = _dump(
        protocol.ChatCompletionResponse(id="0", model="m", choices=choices, usage=_usage())
    )
    for s in decode_sglang_openai(body, DecodeOptions(meta=META, engine_version=VERSION)):
        assert s is not None
        np.testing.assert_array_equal(s.routes_TLK[: P + G - 1], ROUTES)


@needs_sglext
@pytest.mark.parametrize("chat", [False, True])
def test_real_stream_chunks_decode(chat: bool) -> None:
    item = _generate()
    if chat:
        cls, choice = (
            protocol.ChatCompletionStreamResponse,
            protocol.ChatCompletionResponseStreamChoice(
                index=0, delta=protocol.DeltaMessage(content="x"), finish_reason="length"
            ),
        )
    else:
        cls, choice = (
            protocol.CompletionStreamResponse,
            protocol.CompletionResponseStreamChoice(index=0, text="x", finish_reason="length"),
        )
    ext = protocol.SglExt(routed_experts=item["meta_info"]["routed_experts"])
    chunks = [
        _dump(cls(id="0", model="m", choices=[choice])),
        _dump(cls(id="0", model="m", choices=[], sglext=ext)),
        _dump(cls(id="0", model="m", choices=[], usage=_usage())),
        "[DONE]",
    ]
    fake = sglang_openai_stream(item, chat=chat, sglang_version=VERSION)
    assert fake[-2]["sglext"] == chunks[1]["sglext"]
    assert set(fake[-2]) <= set(chunks[1])
    s = decode_sglang_stream(chunks, DecodeOptions(meta=META, engine_version=VERSION)).only()
    assert s is not None
    np.testing.assert_array_equal(s.routes_TLK[: P + G - 1], ROUTES)
    with pytest.raises(Exception, match="no chunk with sglext"):
        decode_sglang_stream([chunks[0], chunks[2]], DecodeOptions(meta=META)).only()


def test_openai_request_start_len_field() -> None:
    fields = protocol.CompletionRequest.model_fields
    assert ("return_routed_experts" in fields) is FLAGS.openai_sglext
    # 0.5.9-0.5.11 OpenAI requests have no routed_experts_start_len: pydantic drops it unread
    assert ("routed_experts_start_len" in fields) is FLAGS.start_len
    if FLAGS.start_len:
        req = protocol.CompletionRequest(
            model="m", prompt="x", return_routed_experts=True, routed_experts_start_len=START
        )
        assert req.routed_experts_start_len == START
    elif FLAGS.openai_sglext:
        req = protocol.CompletionRequest(
            model="m", prompt="x", return_routed_experts=True, routed_experts_start_len=START
        )
        assert not hasattr(req, "routed_experts_start_len")


def _server_args_fields() -> dict[str, Any]:
    """Every ServerArgs field of the wheel and its default, read from the source: the dataclass
    in server_args.py (0.5.7-0.5.2x) and the arg_groups/fields namespaces (0.5.23). ServerArgs
    itself needs triton on import (sglang/srt/utils/common.py), a CUDA-only wheel."""
    files = [ROOT / "sglang/srt/server_args.py"]
    files += sorted((ROOT / "sglang/srt/arg_groups/fields").glob("*.py"))
    fields: dict[str, Any] = {}
    for path in files:
        if not path.exists():
            continue
        for cls in (
            n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)
        ):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    try:
                        default = ast.literal_eval(stmt.value) if stmt.value else None
                    except ValueError:
                        default = "<expression>"
                    fields.setdefault(stmt.target.id, default)
    return fields


def test_server_args_fields_rr_reads_exist_with_the_emulated_defaults() -> None:
    from rr_fakes.emulations.engines import SERVER_FIELDS, sglang_server_info
    from rr_vllm import CaptureError, sglang_engine_config

    fields = _server_args_fields()
    assert "enable_return_routed_experts" in fields  # the capture flag: the scan found ServerArgs
    for name, (_, default) in SERVER_FIELDS.items():
        assert name in fields, f"ServerArgs of {VERSION} has no {name}"
        if name != "chunked_prefill_size":  # None in ServerArgs, resolved by the launcher
            assert fields[name] == default, (name, fields[name])
    defaults = {name: fields[name] for name in SERVER_FIELDS} | {"chunked_prefill_size": 8192}
    config = sglang_engine_config(defaults, sglang_version=VERSION)
    assert config.speculative is None
    assert config.hierarchical_cache is False
    with pytest.raises(CaptureError, match="E7"):
        sglang_engine_config(sglang_server_info(VERSION, speculative_algorithm="NGRAM"))


def _speculative_algorithms(tree: ast.Module) -> set[str]:
    """The algorithm names a wheel's spec_info defines: members of the SpeculativeAlgorithm
    enum (0.5.9+), or the first argument of each registration call (0.5.7's registry)."""
    enums = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm"
    ]
    members = {
        t.id
        for enum in enums
        for s in enum.body
        if isinstance(s, ast.Assign)
        for t in s.targets
        if isinstance(t, ast.Name) and not t.id.startswith("_")
    }
    registered = {
        call.args[0].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "attr", getattr(call.func, "id", "")).startswith("register")
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    }
    return members | registered


def test_speculative_algorithm_names_rr_refuses_are_the_wheels() -> None:
    _, tree = _source("sglang.srt.speculative.spec_info")
    names = _speculative_algorithms(tree)
    from rr_vllm.engine_config import SGLANG_TREE_ALGORITHMS

    # NEXTN is an alias the launcher resolves to EAGLE (arg_groups/cp_tp_group_sharing_hook.py).
    assert SGLANG_TREE_ALGORITHMS - {"NEXTN"} <= names
    if Version(VERSION) >= Version("0.5.23"):  # read in that wheel: spec_info.py
        assert "NGRAM" in names
