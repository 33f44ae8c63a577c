"""What the rr-vllm benchmark scripts share: their size options, how they time candidates and
how they print a result."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any


def sizes_parser(doc: str, samples: int) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--samples`` (default ``samples``),
    ``--tokens``, ``--repeat`` and ``--json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--samples", type=int, default=samples)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def report(result: dict[str, Any], as_json: bool, width: int) -> None:
    """``result`` as one JSON object, or a line per key (names ``width`` wide, floats to 3
    places)."""
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(
            f"{key:{width}s} {value:.3f}" if isinstance(value, float) else f"{key:{width}s} {value}"
        )


def alternate(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each candidate in each of ``repeat`` rounds, the candidates run in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times
