"""What the decoding tests share: one sample's sizes, its routes and engine output, and the check
that its rows sit at their tokens.

Shapes: T tokens, N engine rows, L layer slots (all_layers axis), K top-k, E experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rr_core import RouteMeta
from rr_fakes.emulations.engines import VllmEra
from rr_vllm import SampleRoutes
from vllm_testing import distinct_routes, fake_vllm_output

P, G, L, K = 5, 4, 4, 2
ALL_ERAS = list(VllmEra)
FLAT_ERAS = [VllmEra.V0_14, VllmEra.V0_22, VllmEra.V0_32]


def make_routes(meta: RouteMeta, rows: int = P + G - 1, seed: int = 0) -> np.ndarray:
    return distinct_routes(meta, rows, seed)


def build(era: VllmEra, meta: RouteMeta, routes: np.ndarray, **kw: Any) -> Any:
    return fake_vllm_output(era, meta, routes, P, G, **kw)


def one(samples: Sequence[SampleRoutes | None]) -> SampleRoutes:
    assert len(samples) == 1
    s = samples[0]
    assert s is not None
    return s


def assert_placed(s: SampleRoutes, routes: np.ndarray, prompt_start: int = 0) -> None:
    assert s.routes_TLK.shape == (P + G, *routes.shape[1:])
    np.testing.assert_array_equal(s.routes_TLK[prompt_start : P + G - 1], routes[prompt_start:])
    assert not s.routes_TLK[:prompt_start].any()
    assert not s.routes_TLK[-1].any()
    expected = np.zeros(P + G, dtype=bool)
    expected[prompt_start : P + G - 1] = True
    np.testing.assert_array_equal(s.valid_T, expected)
