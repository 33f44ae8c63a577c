"""verl benchmark: bytes per token and conversion time of rr's compact routes against verl 0.9.1's
own int16 conversion, on a Qwen3-30B-A3B-shaped rollout (48 MoE layers, 128 experts, top-8; uint8
engine arrays of ``T - 1`` rows, as vLLM 0.22+ returns them).

For each codec: ``pack_ms`` is the rollout side (``rr_vllm.decode_vllm_output(...).to_batch()``,
which copies
and validates, then :func:`rr_vllm.pack_batch_for_verl` encoding without validating again),
``expand_ms`` the trainer side (:func:`rr_vllm.to_verl_nested` on the CPU), ``bytes_per_token``
what ships between them. ``verl_ms`` is verl's ``AgentLoopOutput.as_dict`` for every sample plus
``list_of_dict_to_tensordict`` (the TransferQueue trainer's path), timed where verl imports;
``equal_to_verl`` checks the tensors match (``set``: up to the order of each row's ids).

``side_by_side`` runs verl's conversion and every rr path that ends in what a trainer consumes
in alternation, round after round, in this process: ``decode`` (the validated batch),
``decode_layout_uint8`` / ``decode_layout_int16`` (plus :func:`rr_vllm.to_trainer_layout`, the
padded layout), ``decode_raw`` / ``decode_packed`` / ``decode_set`` (plus the codec encode that
ships). ``rr_over_verl`` is the median over rounds of each path's time over verl's in the same
round (goal: at most 1), ``bytes_over_verl`` what the path ships per token over verl's int16
(goal: at most 0.5).

``expand`` alternates the trainer side alone, :func:`rr_vllm.to_verl_nested` of each codec's
routes (and verl's conversion where verl imports), under each kernel family (numba where it
imports, numpy): ``over_raw`` is the median over rounds of each codec's time over ``raw``'s in
the same round (goal for ``set``: at most 2).

``agent_loop`` is the whole hop with ``rr_vllm.verl.install()`` against verl's own code alone,
alternated: verl's ``AgentLoopWorker._agent_loop_postprocess`` per sample and ``_postprocess``
(the agent-loop worker), the batch pickled and unpickled (what Ray ships to the trainer), then
``to_tensordict`` and ``left_right_2_no_padding`` (``RayPPOTrainer``'s conversion for its
engines); ``ms`` per side and in all, ``over_verl`` (median over rounds of the path's time over
verl's in the same round), ``shipped_bytes_per_token`` and its ratio to verl's (the pickled
batch's route bytes per real token: verl pads every sample to ``prompt_length +
response_length`` rows). rr's paths include its install and uninstall.

Usage: ``python bench_vllm_verl.py [--samples 64] [--tokens 4096] [--repeat 7] [--json]``.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

# the rollout capture and the timer of the assembly benchmark next to this file
from bench_common import alternate, sizes_parser
from bench_vllm import EXPERTS, LAYERS, META, TOP_K, available_kernels, best, requests

from rr_core import CODECS, RouteMeta, kernels
from rr_vllm import (
    DecodeOptions,
    decode_vllm_output,
    pack_batch_for_verl,
    to_trainer_layout,
    to_verl_nested,
)


def batch_of(reqs: list[Any], meta: RouteMeta) -> Any:
    """The rollout's validated batch, as a rollout loop makes it (one copy of each array)."""
    return decode_vllm_output(reqs, DecodeOptions(meta=meta)).to_batch()


def verl_functions() -> tuple[Any, Any] | None:
    """verl's agent-loop module and ``list_of_dict_to_tensordict``, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron's fallbacks without apex / TE
            from rr_fakes.shims.megatron import megatron_cpu

            with megatron_cpu():
                from verl.experimental.agent_loop import agent_loop
                from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    except Exception:  # verl or one of its imports is missing
        return None
    return agent_loop, list_of_dict_to_tensordict


def run(samples: int, tokens: int, repeat: int) -> dict[str, Any]:
    meta = META
    reqs = requests(samples, tokens, vary=True)
    prompts = [len(r.prompt_token_ids) for r in reqs]
    result: dict[str, Any] = {
        "samples": samples,
        "tokens_per_sample": tokens,
        "layers": LAYERS,
        "experts": EXPERTS,
        "top_k": TOP_K,
        "threads": torch.get_num_threads(),
        "verl_bytes_per_token": LAYERS * TOP_K * 2,
    }
    result["tokens"] = sum(
        p + len(r.outputs[0].token_ids) for p, r in zip(prompts, reqs, strict=True)
    )
    verl = verl_functions()
    theirs = None
    if verl is not None:
        agent_loop, to_tensordict = verl
        outputs = agent_loop_outputs(agent_loop, reqs)

        def convert() -> Any:
            return to_tensordict([o.as_dict() for o in outputs])["routed_experts"]

        theirs = convert()
        result["verl_ms"] = best(convert, repeat) * 1e3
    else:
        result["verl_ms"] = None
    batch = batch_of(reqs, meta)
    shipped: dict[str, Any] = {}
    for codec in CODECS:

        def pack(codec: str = codec) -> Any:
            return pack_batch_for_verl(batch_of(reqs, meta), prompts, codec=codec, validate=False)

        routes = shipped[codec] = pack()
        ours = to_verl_nested(routes)
        equal = None
        if theirs is not None:
            want = theirs.values().sort(dim=-1).values if codec == "set" else theirs.values()
            equal = bool(
                torch.equal(ours.values(), want) and torch.equal(ours.offsets(), theirs.offsets())
            )
        del ours
        result[codec] = {
            "bytes_per_token": routes.bytes_per_token,
            "pack_ms": best(pack, repeat) * 1e3,
            "encode_only_ms": best(
                lambda c=codec: pack_batch_for_verl(batch, prompts, codec=c, validate=False), repeat
            )
            * 1e3,
            "expand_ms": best(lambda r=routes: to_verl_nested(r), repeat) * 1e3,
            "equal_to_verl": equal,
        }
    result["expand"] = expand(shipped, convert if verl is not None else None, repeat)
    if verl is not None:
        result["side_by_side"] = side_by_side(reqs, meta, prompts, tokens, convert, repeat)
        result["agent_loop"] = agent_loop_hop(verl[0], reqs, tokens, repeat)
    return result


def agent_loop_hop(module: Any, reqs: list[Any], tokens: int, repeat: int) -> dict[str, Any]:
    """verl's agent-loop-to-engine hop with and without rr's rollout side (see the doc)."""
    import pickle

    from verl.workers.utils import padding  # read at each call: install() patches it

    import rr_vllm.verl as rollout
    from rr_fakes.shims.verl import agent_loop_batch, agent_loop_worker

    config = {"num_hidden_layers": LAYERS, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K}
    worker = agent_loop_worker(
        config, prompt_length=tokens // 4, response_length=tokens - tokens // 4
    )

    sides: dict[str, dict[str, float]] = {}
    shipped: dict[str, int] = {}

    def hop(name: str, codec: str | None) -> Callable[[], Any]:
        def run() -> Any:
            if codec is not None:
                rollout.install(codec=codec)
            try:
                items = agent_loop_outputs(module, reqs)
                start = time.perf_counter()
                proto = agent_loop_batch(worker, items)
                wire = pickle.dumps(proto, protocol=5)
                middle = time.perf_counter()
                data = padding.left_right_2_no_padding(pickle.loads(wire).to_tensordict())
                end = time.perf_counter()
            finally:
                if codec is not None:
                    rollout.uninstall()
            sides.setdefault(name, {"rollout": [], "trainer": []})  # type: ignore[dict-item]
            sides[name]["rollout"].append(middle - start)  # type: ignore[attr-defined]
            sides[name]["trainer"].append(end - middle)  # type: ignore[attr-defined]
            shipped[name] = len(wire)
            return data["routed_experts"]

        return run

    paths = {"verl": hop("verl", None), **{c: hop(c, c) for c in CODECS}}
    want = paths["verl"]().values()
    equal = {}
    for codec in CODECS:
        got = paths[codec]().values()
        equal[codec] = bool(torch.equal(got, want.sort(-1).values if codec == "set" else want))
    sides.clear()
    times = alternate(paths, repeat)
    num_tokens = sum(len(r.prompt_token_ids) + len(r.outputs[0].token_ids) for r in reqs)
    no_routes = len(
        pickle.dumps(agent_loop_batch(worker, _without(agent_loop_outputs(module, reqs))))
    )
    route_bytes = {name: (n - no_routes) / num_tokens for name, n in shipped.items()}
    return {
        "equal_to_verl": equal,
        "ms": {name: statistics.median(ts) * 1e3 for name, ts in times.items()},
        "rollout_ms": {n: statistics.median(v["rollout"]) * 1e3 for n, v in sides.items()},
        "trainer_ms": {n: statistics.median(v["trainer"]) * 1e3 for n, v in sides.items()},
        "over_verl": {
            name: statistics.median(t / v for t, v in zip(ts, times["verl"], strict=True))
            for name, ts in times.items()
            if name != "verl"
        },
        "shipped_bytes_per_token": route_bytes,
        "shipped_over_verl": {n: b / route_bytes["verl"] for n, b in route_bytes.items()},
    }


def agent_loop_outputs(module: Any, reqs: list[Any]) -> list[Any]:
    """verl's ``AgentLoopOutput`` of each engine answer, as its single-turn loop builds one."""
    return [
        module.AgentLoopOutput(
            prompt_ids=r.prompt_token_ids,
            response_ids=r.outputs[0].token_ids,
            response_mask=[1] * len(r.outputs[0].token_ids),
            routed_experts=r.outputs[0].routed_experts,
            metrics=module.AgentLoopMetrics(),
        )
        for r in reqs
    ]


def _without(items: list[Any]) -> list[Any]:
    """The same outputs without routes (the batch's other bytes, subtracted above)."""
    return [o.model_copy(update={"routed_experts": None}) for o in items]


def expand(
    shipped: dict[str, Any], verl_convert: Callable[[], Any] | None, repeat: int
) -> dict[str, Any]:
    """The trainer side per kernel family: each codec's to_verl_nested (and verl's conversion)
    in alternation; medians, and each path's time over raw's in the same round."""
    out: dict[str, Any] = {}
    for family in available_kernels():
        with kernels.use_kernel(family):
            paths = {codec: (lambda r=r: to_verl_nested(r)) for codec, r in shipped.items()}
            if verl_convert is not None:
                paths["verl"] = verl_convert
            to_verl_nested(shipped["set"])  # compiles the kernels outside the timing
            times = alternate(paths, repeat)
        out[family] = {
            "ms": {name: statistics.median(ts) * 1e3 for name, ts in times.items()},
            "over_raw": {
                name: statistics.median(t / r for t, r in zip(ts, times["raw"], strict=True))
                for name, ts in times.items()
            },
        }
    return out


def side_by_side(
    reqs: list[Any],
    meta: RouteMeta,
    prompts: list[int],
    tokens: int,
    verl_convert: Callable[[], Any],
    repeat: int,
) -> dict[str, Any]:
    """verl's conversion and rr's paths in alternation; ratios of medians over rounds."""
    num_tokens = sum(p + len(r.outputs[0].token_ids) for p, r in zip(prompts, reqs, strict=True))
    verl_bytes = LAYERS * TOP_K * 2
    sizes = {"prompt_length": tokens // 4, "response_length": tokens - tokens // 4}

    def layout(dtype: torch.dtype) -> Callable[[], Any]:
        return lambda: (
            to_trainer_layout(batch_of(reqs, meta), prompts, **sizes, dtype=dtype).routes_BSLK
        )

    def encode(codec: str) -> Callable[[], Any]:
        return lambda: pack_batch_for_verl(
            batch_of(reqs, meta), prompts, codec=codec, validate=False
        )

    paths: dict[str, Callable[[], Any]] = {
        "verl": verl_convert,
        "decode": lambda: batch_of(reqs, meta),
        "decode_layout_uint8": layout(torch.uint8),
        "decode_layout_int16": layout(torch.int16),
        **{f"decode_{codec}": encode(codec) for codec in CODECS},
    }
    shipped = {
        name: fn().nbytes if name.startswith("decode_layout") else None
        for name, fn in paths.items()
    }
    for codec in CODECS:
        shipped[f"decode_{codec}"] = paths[f"decode_{codec}"]().nbytes
    times = alternate(paths, repeat)
    out: dict[str, Any] = {
        "kernel": kernels.kernel(),
        "rounds": repeat,
        "verl_ms": statistics.median(times["verl"]) * 1e3,
        "ms": {name: statistics.median(ts) * 1e3 for name, ts in times.items()},
        "rr_over_verl": {
            name: statistics.median(t / v for t, v in zip(ts, times["verl"], strict=True))
            for name, ts in times.items()
            if name != "verl"
        },
        "bytes_per_token": {name: n / num_tokens for name, n in shipped.items() if n is not None},
    }
    out["bytes_over_verl"] = {k: v / verl_bytes for k, v in out["bytes_per_token"].items()}
    return out


def main() -> None:
    args = sizes_parser(__doc__, samples=64).parse_args()
    result = run(args.samples, args.tokens, args.repeat)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if key == "side_by_side":
            print(json.dumps(value, indent=1))
        elif isinstance(value, dict):
            print(
                key,
                " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()
                ),
            )
        else:
            print(f"{key:24s} {value:.1f}" if isinstance(value, float) else f"{key:24s} {value}")


if __name__ == "__main__":
    main()
