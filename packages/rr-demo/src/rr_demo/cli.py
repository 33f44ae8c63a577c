"""``rr demo``: the main job end to end on CPU (real megatron-core, emulated engine).

Registered through rr-demo's ``rr.commands`` entry point. Nothing heavy is imported until the
command runs, so ``rr --help`` and ``rr doctor`` stay fast.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any


def render(result: Any) -> str:
    """The figures as a table."""
    rows = [
        ("megatron-core", result.megatron_core_version, ""),
        ("rollout objects", result.vllm_objects, "real vllm when importable"),
        ("", "without replay", "with R3 replay"),
        (
            "expert sets differing from rollout",
            f"{result.mismatch_without_replay:.2%}",
            f"{result.mismatch_with_replay:.2%}",
        ),
        (
            "mean |delta log p| of sampled tokens",
            f"{result.logprob_abs_diff_without_replay:.2e}",
            f"{result.logprob_abs_diff_with_replay:.2e}",
        ),
        (
            "KL(rollout || trainer), k3",
            f"{result.kl_without_replay:.2e}",
            f"{result.kl_with_replay:.2e}",
        ),
        ("training step under replay (loss)", "", f"{result.train_loss_with_replay:.4f}"),
        ("", "", ""),
        *(
            (f"route bytes per token, {codec}", f"{size:.1f}", "")
            for codec, size in result.bytes_per_token.items()
        ),
        ("record file (packed, checksummed)", f"{result.record_file_bytes} bytes", ""),
        ("run time", f"{result.seconds:.1f} s", ""),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>18}  {c}" for a, b, c in rows)


def plot(result: Any, path: str) -> None:
    """Per-layer routing mismatch without and with replay, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    xs = list(range(len(result.layers)))
    ax.bar([x - 0.2 for x in xs], result.mismatch_per_layer_without_replay, 0.4, label="no replay")
    ax.bar([x + 0.2 for x in xs], result.mismatch_per_layer_with_replay, 0.4, label="R3 replay")
    ax.set_xticks(xs, [str(layer) for layer in result.layers])
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("share of tokens routed differently")
    ax.set_title("Trainer vs rollout routing")
    top = max(result.mismatch_per_layer_without_replay, default=0.0)
    ax.set_ylim(0, max(top * 1.4, 0.01))
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rr_demo.run import DemoConfig, run_demo

    stages = 6
    with tqdm(total=stages, desc="rr demo", unit="stage", disable=args.json) as bar:
        started = [False]

        def progress(stage: str) -> None:
            if started[0]:
                bar.update(1)
            started[0] = True
            bar.set_postfix_str(stage)

        result = run_demo(DemoConfig(), progress=progress)
        bar.update(1)
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(render(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0 if result.mismatch_with_replay == 0.0 else 1


def register(commands: Any) -> None:
    """Add ``rr demo`` to the ``rr`` command (entry point ``rr.commands``)."""
    parser = commands.add_parser("demo", help="replay a rollout in real Megatron on CPU")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--plot", metavar="PNG", help="write the per-layer mismatch plot")
    parser.set_defaults(func=_run)
