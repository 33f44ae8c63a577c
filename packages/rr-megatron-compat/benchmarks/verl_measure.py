"""bench_verl's clock: thread CPU time and wall time of each side, per round, and their
medians and ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# -- timing ------------------------------------------------------------------------------------


@dataclass
class Span:
    """Thread CPU time and wall time, nanoseconds."""

    cpu: int = 0
    wall: int = 0

    def __iadd__(self, other: Span) -> Span:
        self.cpu += other.cpu
        self.wall += other.wall
        return self


def now() -> Span:
    return Span(time.thread_time_ns(), time.perf_counter_ns())


def since(start: Span) -> Span:
    end = now()
    return Span(end.cpu - start.cpu, end.wall - start.wall)


class Samples:
    """Per-round spans of each side of one figure."""

    def __init__(self) -> None:
        self.spans: dict[str, list[Span]] = {}

    def add(self, side: str, span: Span) -> None:
        self.spans.setdefault(side, []).append(span)

    def median(self, side: str, what: str) -> float:
        return statistics.median(getattr(s, what) for s in self.spans[side]) / 1e6  # ms

    def report(self, sides: Sequence[str], base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for what in ("cpu", "wall"):
            for side in sides:
                out[f"{side}_{what}_ms"] = round(self.median(side, what), 4)
            for side in sides:
                if side != base:
                    out[f"{side}_over_{base}_{what}"] = round(
                        self.median(side, what) / self.median(base, what), 3
                    )
        return out
