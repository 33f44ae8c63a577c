"""A rollout emulator: autoregressive generation over a tiny MoE model with perturbed router
numerics, capturing routes the way an inference engine does.

What it mirrors (``vllm-facts.md``): the prefill routes every prompt position, each decode step
routes the token it feeds, and the last sampled token is never fed, so a sequence of T = P+G
tokens has T-1 rows; rows are on the all-layers axis with dense layers as all-zero rows. With
``prefix_caching``, prompt blocks seen before are not recomputed: their rows come from the
earlier request's capture (a store, as in 0.32+) and :attr:`Rollout.cached_prefix` says how many
(0.21 returns -1 there). ``noise`` adds Gaussian noise to the router scores at the top-k step
only, emulating inference kernels whose numerics differ from the trainer's.

Any model works whose routers call :func:`rr_core.router_topk` (the routers of
:func:`rr_fakes.build_tiny_moe`, or real Megatron routers with the replay hook installed) and
that maps token ids to logits (``forward`` adapts the call; ``attach`` gives the recorder the
routers of models whose layers carry no ``layer_number``, such as transformers models).

Shapes: T tokens, E experts, K top-k, L layer slots, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch import nn

from rr_core import ReplayController, ReplayMode, TopK
from rr_fakes.emulations.engines import (
    NO_FAULTS,
    Faults,
    VllmEra,
    sglang_response,
    vllm_request_output,
)

ForwardFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]
AttachFn = Callable[[ReplayController, nn.Module], tuple[int, ...]]


def _default_attach(controller: ReplayController, model: nn.Module) -> tuple[int, ...]:
    return controller.attach(model)


def _default_forward(model: nn.Module, input_ids_1S: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(input_ids_1S)
    return out


class _NoisyRecorder(ReplayController):
    """RECORD mode with Gaussian noise added to the scores used for selection only."""

    def __init__(self, *, noise: float, generator: torch.Generator, **kw: Any) -> None:
        super().__init__(measure_agreement=False, **kw)
        self.noise, self.generator = noise, generator
        self.used: dict[int, torch.Tensor] = {}  # id(router) -> ids it used in the last forward
        self._walked: list[nn.Module] = []

    def attach(self, model: Any, **kw: Any) -> tuple[int, ...]:
        layers = super().attach(model, **kw)
        self._walked = list(self._routers)  # in layer order, however they were walked
        return layers

    def used_in_layer_order(self) -> list[torch.Tensor]:
        return [self.used[id(router)] for router in self._walked]

    def route(self, router: nn.Module, scores_TE: torch.Tensor, k: int, **kw: Any) -> TopK:
        """The controller's route; with ``noise`` the noisy scores pick the experts and the
        clean ones (or the ``values_TE`` given) weigh them."""
        values_TE = kw.pop("values_TE", None)
        if self.noise:
            noise_TE = torch.randn(scores_TE.shape, generator=self.generator).to(scores_TE)
            values_TE = scores_TE if values_TE is None else values_TE
            scores_TE = scores_TE + self.noise * noise_TE
        out = super().route(router, scores_TE, k, values_TE=values_TE, **kw)
        self.used[id(router)] = out.ids_TK.detach()
        return out


@dataclass(frozen=True)
class Rollout:
    """One generated sequence and its routes as the engine captured them."""

    prompt_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    routes_TLK: np.ndarray  # [P+G-1, num_layers, K] int64, all-layers axis
    moe_layer_numbers: tuple[int, ...]
    num_experts: int
    cached_prefix: int = 0

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.generated_ids

    def vllm_output(self, era: VllmEra | str, *, faults: Faults = NO_FAULTS, **kw: Any) -> Any:
        """The routes as vLLM of ``era`` returns them (see :func:`vllm_request_output`, which
        takes each field of the rollout by its name)."""
        rollout = {f.name: getattr(self, f.name) for f in fields(self)}
        return vllm_request_output(era, **rollout, faults=faults, **kw)

    def sglang_output(self, **kw: Any) -> dict[str, Any]:
        """The routes as SGLang returns them (see :func:`sglang_response`)."""
        return sglang_response(
            prompt_ids=self.prompt_ids,
            generated_ids=self.generated_ids,
            routes_TLK=self.routes_TLK,
            cached_tokens=self.cached_prefix,
            num_experts=self.num_experts,
            **kw,
        )


@dataclass
class RolloutEmulator:
    """Generates with ``model`` (batch of one, full recompute each step) and captures routes.

    ``num_layers`` sizes the all-layers axis (default: ``len(model.decoder.layers)``).
    ``noise`` is the standard deviation added to router scores at selection; ``seed`` seeds
    the noise and sampling. ``prefix_caching`` reuses rows of earlier requests for whole
    ``block_size`` blocks of a shared prompt prefix (never the last prompt token).
    """

    model: nn.Module
    num_experts: int
    top_k: int
    num_layers: int | None = None
    noise: float = 0.0
    seed: int = 0
    forward: ForwardFn = _default_forward
    attach: AttachFn = _default_attach
    prefix_caching: bool = False
    block_size: int = 16
    _seen: list[tuple[tuple[int, ...], np.ndarray]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._generator = torch.Generator().manual_seed(self.seed)

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        eos_id: int | None = None,
    ) -> Rollout:
        """Greedy (``temperature`` 0) or sampled continuation of ``prompt_ids``."""
        if not prompt_ids or max_new_tokens < 1:
            raise ValueError("need a non-empty prompt and max_new_tokens >= 1")
        recorder = _NoisyRecorder(
            noise=self.noise,
            generator=self._generator,
            num_experts=self.num_experts,
            top_k=self.top_k,
        )
        layers = self.attach(recorder, self.model)
        try:
            sequence = [int(t) for t in prompt_ids]
            logits_V, rows = self._step(recorder, sequence)
            generated = [self._sample(logits_V, temperature)]
            while len(generated) < max_new_tokens and generated[-1] != eos_id:
                sequence.append(generated[-1])
                logits_V, rows = self._step(recorder, sequence, rows)
                generated.append(self._sample(logits_V, temperature))
        finally:
            recorder.detach()
        prompt = tuple(int(t) for t in prompt_ids)
        cached = self._apply_prefix_cache(prompt, rows)
        routes = self._all_layers(rows, layers)
        if cached:
            routes[:cached] = self._cached_rows(prompt, cached)
        self._seen.append((prompt + tuple(generated), routes))
        return Rollout(prompt, tuple(generated), routes, layers, self.num_experts, cached)

    def _step(
        self, recorder: _NoisyRecorder, sequence: list[int], prefix_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """One forward over ``sequence``; returns the last position's logits and the routes of
        every row. With ``prefix_rows`` the prefix is replayed and only the new token is routed
        (noisily), as an engine with a KV cache routes each token once."""
        ids_1S = torch.tensor([sequence], dtype=torch.long)
        microbatch: Hashable = 0
        if prefix_rows is None:
            recorder.set_mode(ReplayMode.RECORD)
        else:
            recorder.set_mode(ReplayMode.REPLAY)
            T, (M, K) = len(sequence), prefix_rows.shape[1:]
            armed_TMK = torch.zeros(T, M, K, dtype=torch.int64)
            armed_TMK[:-1] = torch.from_numpy(prefix_rows)
            new_row_T = torch.arange(T) < T - 1  # the new token routes natively
            recorder.arm(
                microbatch, armed_TMK, layer_numbers=recorder.layer_numbers, replay_mask_T=new_row_T
            )
        recorder.used.clear()
        with torch.no_grad(), recorder.microbatch(microbatch):
            logits = self.forward(self.model, ids_1S)
        if prefix_rows is None:
            rows = recorder.recorded(microbatch).cpu().numpy().astype(np.int64)
        else:
            last_MK = torch.stack([ids_TK[-1] for ids_TK in recorder.used_in_layer_order()])
            rows = np.concatenate([prefix_rows, last_MK.cpu().numpy()[None].astype(np.int64)])
        recorder.end_step()
        return logits.reshape(-1, logits.shape[-1])[-1].float(), rows

    def _sample(self, logits_V: torch.Tensor, temperature: float) -> int:
        if temperature <= 0:
            return int(logits_V.argmax())
        probs_V = torch.softmax(logits_V / temperature, dim=-1)
        return int(torch.multinomial(probs_V, 1, generator=self._generator))

    def _all_layers(self, rows_TMK: np.ndarray, layers: Sequence[int]) -> np.ndarray:
        decoder = getattr(self.model, "decoder", None)
        default = len(decoder.layers) if decoder is not None else max(layers, default=0)
        num_layers = self.num_layers or default
        routes = np.zeros((rows_TMK.shape[0], num_layers, self.top_k), dtype=np.int64)
        routes[:, [n - 1 for n in layers]] = rows_TMK
        return routes

    def _apply_prefix_cache(self, prompt: tuple[int, ...], rows: np.ndarray) -> int:
        if not self.prefix_caching:
            return 0
        best = 0
        for tokens, _ in self._seen:
            common = 0
            for a, b in zip(tokens, prompt, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        return min(best, len(prompt) - 1) // self.block_size * self.block_size

    def _cached_rows(self, prompt: tuple[int, ...], cached: int) -> np.ndarray:
        for tokens, routes in self._seen:
            if tokens[:cached] == prompt[:cached] and routes.shape[0] >= cached:
                return routes[:cached]
        raise AssertionError("a cached prefix without its rows")


def record_routes(
    model: nn.Module,
    token_ids: Sequence[int],
    *,
    num_experts: int,
    top_k: int,
    num_layers: int | None = None,
    forward: ForwardFn = _default_forward,
    attach: AttachFn = _default_attach,
) -> np.ndarray:
    """The trainer's view: one noise-free teacher-forced forward over all T tokens, routes
    ``[T, num_layers, K]`` on the all-layers axis (dense layers zero)."""
    emulator = RolloutEmulator(
        model, num_experts, top_k, num_layers=num_layers, forward=forward, attach=attach
    )
    recorder = _NoisyRecorder(
        noise=0.0, generator=emulator._generator, num_experts=num_experts, top_k=top_k
    )
    layers = attach(recorder, model)
    try:
        _, rows = emulator._step(recorder, [int(t) for t in token_ids])
    finally:
        recorder.detach()
    return emulator._all_layers(rows, layers)
