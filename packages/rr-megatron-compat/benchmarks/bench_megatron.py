"""Training-step time of a real GPTModel on CPU with R3 replay on vs off, side by side.

Same model, same micro-batches, variants alternated round by round, each round in a fresh
shuffled order (seeded) so neither drift nor the variant run just before favours one; reports
the median step time of each, in process CPU time (garbage collection between timings, not
inside them). "Off" is a model with rr installed but no controller attached
(Megatron's code untouched); "r3" arms the recorded routes with R3's replay mask (the last
token of each sequence routes natively) and reports the step's agreement (the controller's
default, a threshold test on the router's scores); "r3_exact" measures agreement with a
second native top-k; "r3_no_agreement" measures none. ``step_overhead_ratio_r3`` = r3 / off
- 1.

Then one router call (the first MoE layer's ``TopKRouter`` forward on one micro-batch's hidden
states, training mode), native (no controller attached) against replaying in R3 with and
without the agreement, the same way: variants alternated in a fresh shuffled order each round,
the median over rounds of each variant's mean call time. ``router_call_r3_over_native`` is
what rr costs per router call, everything it adds around Megatron's routing included.

Both on two workloads: a tiny MoE (E=8, top-2, 2 x 128 tokens), where Megatron's top-k costs
a few microseconds and every torch call rr adds is dearer than its data (the CPU harness
routes each one through a TorchFunctionMode), and the same model with Qwen3-30B-A3B's routers
(E=128, top-8, experts a quarter of the hidden size wide, 2 x 512 tokens: ``router_shaped``),
where the top-k replay skips is real work. ``*_paired`` figures are the median of each round's
own ratio. The harness runs megatron-core on CPU only.

    python packages/rr-megatron-compat/benchmarks/bench_megatron.py [--json] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import rr_megatron_compat as rmc
from rr_core import ReplayController, ReplayMode, walk_routers
from rr_fakes.shims.megatron import TinyGPTConfig, build_gpt, gpt_inputs, model_parallel, train_step


def run(
    rounds: int, hidden: int, seq: int, microbatches: int, experts: int = 8, top_k: int = 2
) -> dict[str, Any]:
    torch.set_num_threads(1)
    with model_parallel():
        rmc.install()
        try:
            extra: dict[str, Any] = rmc.replay_config_fields()
            if experts > 8:  # experts as narrow as a fine-grained MoE's (Qwen3-30B-A3B: H / 2.7)
                extra["moe_ffn_hidden_size"] = max(8, hidden // 4)
            config = TinyGPTConfig(
                hidden_size=hidden,
                ffn_hidden_size=2 * hidden,
                num_attention_heads=4,
                num_experts=experts,
                top_k=top_k,
                max_sequence_length=seq,
                aux_loss_coeff=0.01,
                extra=extra,
            )
            model = build_gpt(config)
            batches = [gpt_inputs(microbatches, seq, 64)]  # one micro-batch (rr's default id)
            controller = ReplayController(num_experts=experts, top_k=top_k)
            rmc.attach(controller, model)
            controller.set_mode(ReplayMode.RECORD)
            train_step([model], batches[:1])
            # uint8, as R3 routes arrive from an engine (rr_vllm decodes the narrowest dtype)
            routes = controller.recorded(0, dtype=torch.uint8)
            layers = controller.layer_numbers
            controller.end_step()
            controller.detach()
            # router rows are [S, B] (sequence-major): the last token of every sequence is
            # the last B rows, which R3 leaves native (the engine never routed it)
            mask = torch.ones(routes.shape[0], dtype=torch.bool)
            mask[-microbatches:] = False
            bookkeeping: dict[str, list[float]] = {name: [] for name in VARIANTS}
            times = _alternated(
                VARIANTS,
                rounds,
                lambda name: _timed_step(
                    model, batches, routes, mask, name, experts, top_k, bookkeeping[name]
                ),
            )
            calls = _router_calls_per_step(model, batches)
            layer, router = walk_routers(model)[0]
            hidden_SBH = torch.randn(seq, microbatches, hidden)  # the router's [S, B, H] input
            routes_T1K = routes[:, layers.index(layer)].unsqueeze(1)
            call_times = _alternated(
                CALL_VARIANTS,
                rounds,
                lambda name: _timed_calls(
                    router, layer, hidden_SBH, routes_T1K, mask, name, experts, top_k
                ),
            )
        finally:
            rmc.uninstall()
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    paired = {  # the median of each round's own ratio: drift between rounds cancels
        name: statistics.median(t / o for t, o in zip(ts, times["off"], strict=True))
        for name, ts in times.items()
    }
    call_us = {name: statistics.median(ts) * 1e6 for name, ts in call_times.items()}
    off_s, on_s = step_s["off"], step_s["r3"]
    # rr's own measured costs in a step: each router call's difference times the calls a step
    # makes, plus arming and the step's end (the steps themselves vary more than rr costs)
    arm_end_us = statistics.median(bookkeeping["r3"][1:]) * 1e6  # the warm-up round dropped
    attributed_us = calls * (call_us["r3"] - call_us["native"]) + arm_end_us
    return {
        "megatron_core": str(rmc.megatron_line().version),
        "rounds": rounds,
        "hidden_size": hidden,
        "seq_length": seq,
        "sequences": microbatches,
        "num_experts": experts,
        "top_k": top_k,
        "step_s_replay_off": off_s,
        "step_s_replay_r3": on_s,
        "step_s_replay_r3_exact": step_s["r3_exact"],
        "step_s_replay_r3_no_agreement": step_s["r3_no_agreement"],
        "step_overhead_ratio_r3": on_s / off_s - 1.0,
        "r3_over_off": on_s / off_s,
        "r3_exact_over_off": step_s["r3_exact"] / off_s,
        "r3_no_agreement_over_off": step_s["r3_no_agreement"] / off_s,
        "r3_over_off_paired": paired["r3"],
        "r3_exact_over_off_paired": paired["r3_exact"],
        "r3_no_agreement_over_off_paired": paired["r3_no_agreement"],
        "router_call_us_native": call_us["native"],
        "router_call_us_r3": call_us["r3"],
        "router_call_us_r3_no_agreement": call_us["r3_no_agreement"],
        "router_call_r3_over_native": call_us["r3"] / call_us["native"],
        "router_call_r3_no_agreement_over_native": call_us["r3_no_agreement"] / call_us["native"],
        "router_calls_per_step": calls,
        "arm_and_end_step_us_r3": arm_end_us,
        "r3_over_off_attributed": 1.0 + attributed_us / (off_s * 1e6),
    }


def _router_calls_per_step(model: Any, batches: list[Any]) -> int:
    """How many router forwards one training step runs (forward and any recompute)."""
    calls = [0]

    def count(module: Any, args: Any) -> None:
        calls[0] += 1

    hooks = [router.register_forward_pre_hook(count) for _, router in walk_routers(model)]
    try:
        train_step([model], batches)
    finally:
        for hook in hooks:
            hook.remove()
    return calls[0]


VARIANTS = ("off", "r3", "r3_exact", "r3_no_agreement")
CALL_VARIANTS = ("native", "r3", "r3_no_agreement")
_AGREEMENT: dict[str, bool | str] = {"r3": True, "r3_exact": "exact", "r3_no_agreement": False}
#: router calls timed together per variant and round (one call is ~0.3 ms on CPU)
CALLS_PER_ROUND = 50


def _alternated(
    variants: tuple[str, ...], rounds: int, measure: Callable[[str], float]
) -> dict[str, list[float]]:
    """``measure(variant)`` of every variant once per round, each round in a fresh shuffled
    order (seeded); the first round warms up and is dropped."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = random.Random(0)
    gc.disable()  # a collection lands on whichever variant allocates past the threshold
    try:
        for i in range(rounds + 1):
            for name in order.sample(variants, len(variants)):
                gc.collect()
                elapsed = measure(name)
                if i:
                    times[name].append(elapsed)
    finally:
        gc.enable()
    return times


def _clock() -> float:
    # process CPU time: what the step costs this process, least disturbed by other load on a
    # shared machine (one torch thread; autograd's CPU backward runs in the calling thread)
    return time.process_time()


def _timed_step(
    model: Any,
    batches: list[Any],
    routes: torch.Tensor,
    mask: torch.Tensor,
    name: str,
    experts: int,
    top_k: int,
    bookkeeping: list[float],
) -> float:
    """One training step of variant ``name``, in seconds (arming and the step's end included,
    and their own time appended to ``bookkeeping``)."""
    if name == "off":
        start = _clock()
        train_step([model], batches)
        return _clock() - start
    controller = ReplayController(
        num_experts=experts, top_k=top_k, measure_agreement=_AGREEMENT[name]
    )
    rmc.attach(controller, model)
    try:
        controller.set_mode(ReplayMode.REPLAY)
        start = _clock()
        controller.arm(0, routes, layer_numbers=controller.layer_numbers, replay_mask_T=mask)
        armed = _clock()
        train_step([model], batches)
        trained = _clock()
        report = controller.end_step()
        end = _clock()
        elapsed = end - start
        bookkeeping.append(armed - start + end - trained)
    finally:
        controller.detach()
    assert bool(report.agreement) == (name != "r3_no_agreement")
    return elapsed


def _timed_calls(
    router: Any,
    layer: int,
    hidden_SBH: torch.Tensor,
    routes_T1K: torch.Tensor,
    mask: torch.Tensor,
    name: str,
    experts: int,
    top_k: int,
) -> float:
    """Mean seconds of one forward of ``router`` in variant ``name``: "native" with no
    controller attached (rr installed, Megatron's code untouched), else replaying
    ``routes_T1K`` with R3's mask (attaching, arming and the step's end untimed)."""
    controller = None
    if name != "native":
        controller = ReplayController(
            num_experts=experts, top_k=top_k, measure_agreement=_AGREEMENT[name]
        )
        rmc.attach(controller, router)
        controller.set_mode(ReplayMode.REPLAY)
        controller.arm(0, routes_T1K, layer_numbers=(layer,), replay_mask_T=mask)
    try:
        start = _clock()
        for _ in range(CALLS_PER_ROUND):
            router(hidden_SBH)
        elapsed = (_clock() - start) / CALLS_PER_ROUND
        if controller is not None:
            report = controller.end_step()
            assert bool(report.agreement) == (name != "r3_no_agreement")
    finally:
        if controller is not None:
            controller.detach()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=2, help="sequences per step")
    parser.add_argument(
        "--router-rows",
        type=int,
        default=1024,
        help="rows per router call of the second workload (E=128, top-8); 0 skips it",
    )
    parser.add_argument("--device", default="cpu", help="cpu only: the harness runs on CPU")
    args = parser.parse_args()
    if torch.device(args.device).type != "cpu":
        print(json.dumps({"skipped": f"the megatron-core harness runs on CPU, not {args.device}"}))
        return
    result = run(args.rounds, args.hidden, args.seq, args.microbatches)
    if args.router_rows:
        seq = args.router_rows // args.microbatches
        result["router_shaped"] = run(
            args.rounds, args.hidden, seq, args.microbatches, ROUTER_EXPERTS, ROUTER_TOP_K
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, figures in (("", result), ("router_shaped.", result.get("router_shaped", {}))):
        for key, value in figures.items():
            if isinstance(value, dict):
                continue
            shown = f"{value:.4f}" if isinstance(value, float) else value
            print(f"{name + key:54} {shown}")


#: The second workload's routers: Qwen3-30B-A3B's (128 experts, top-8)
ROUTER_EXPERTS, ROUTER_TOP_K = 128, 8


if __name__ == "__main__":
    main()
