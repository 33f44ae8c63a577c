"""bench_transformers' clock: where the timed work runs (``--device``), the time it reads
(process CPU time on CPU, synchronized wall time on an accelerator) and the summaries of the
samples."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.benchmark import Timer

#: Where the step and the router calls run (``--device``).
DEVICE = [torch.device("cpu")]


def sync() -> None:
    """Wait for the accelerator, so a step's time is its own (nothing on CPU)."""
    if DEVICE[0].type == "cuda":
        torch.cuda.synchronize()


def clock() -> float:
    """Process CPU time on CPU (least disturbed by other load); wall time on an accelerator."""
    sync()
    return time.process_time() if DEVICE[0].type == "cpu" else time.perf_counter()


def quartiles(on: list[float], off: list[float]) -> list[float]:
    """Quartiles of the per-round ratio on / off (the spread behind the medians)."""
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return [float(q) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else ratios


def median_us(stmt: str, env: dict[str, Any], min_run_time: float = 1.0) -> float:
    """Median process CPU time of ``stmt`` in microseconds (wall time, synchronized, on an
    accelerator)."""
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads(), timer=clock)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)
