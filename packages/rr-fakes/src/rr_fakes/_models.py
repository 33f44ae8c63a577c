"""Tiny token-in, logits-out MoE models shaped like Megatron's GPTModel where replay looks.

How they differ from :mod:`rr_fakes._tiny_moe` (the causal model the rollout emulator
samples from): every token routes on its own (no token mixing), and the layouts that broke
replay in the field are built in (pipeline chunks, dense, hash-routed and MTP layers, orphan
routers); :mod:`rr_fakes._builders` assembles them.

Shapes: N tokens (flattened), H hidden, E experts, K top-k, V vocabulary, L MoE layers.

What matters to replay is mirrored: decoder layers carry a global 1-based ``layer_number``,
the decoder lives at ``model.decoder`` with its layers in ``decoder.layers``, the MTP block at
``model.mtp`` restarts numbering at 1, and a pipeline chunk embeds only when it is the first
stage (``pre_process``) and projects to the vocabulary only when it is the last
(``post_process``). Tokens of any input shape are routed in row-major order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from rr_fakes._routers import FakeHashGate, FakeTopKRouter


class FakeExperts(nn.Module):
    """E small ``tanh(x W_e)`` experts, computed densely (tiny sizes make that cheapest)."""

    def __init__(self, hidden_size: int, num_experts: int, generator: torch.Generator) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.randn(num_experts, hidden_size, hidden_size, generator=generator)
            * hidden_size**-0.5
        )

    def forward(
        self, x_NH: torch.Tensor, probs_NK: torch.Tensor, ids_NK: torch.Tensor
    ) -> torch.Tensor:
        out_NEH = torch.tanh(torch.einsum("nh,ehd->ned", x_NH, self.weight))
        index_NKH = ids_NK.unsqueeze(-1).expand(-1, -1, out_NEH.shape[-1])
        return (probs_NK.unsqueeze(-1) * out_NEH.gather(1, index_NKH)).sum(dim=1)


class FakeMoEMLP(nn.Module):
    """Router plus experts, at ``layer.mlp`` as Megatron's MoELayer sits."""

    def __init__(self, router: FakeTopKRouter, experts: FakeExperts) -> None:
        super().__init__()
        self.router, self.experts = router, experts

    def forward(self, x_NH: torch.Tensor) -> torch.Tensor:
        probs_NK, ids_NK = self.router(x_NH)
        out_NH: torch.Tensor = self.experts(x_NH, probs_NK, ids_NK)
        return out_NH


class FakeMoELayer(nn.Module):
    """A decoder layer whose MLP is a routed MoE (``mlp.router`` like Megatron's MoELayer)."""

    def __init__(
        self,
        layer_number: int,
        hidden_size: int,
        router: FakeTopKRouter,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.mlp = FakeMoEMLP(router, FakeExperts(hidden_size, router.num_experts, generator))

    @property
    def router(self) -> FakeTopKRouter:
        return self.mlp.router

    def forward(self, x_NH: torch.Tensor, token_ids_N: torch.Tensor) -> torch.Tensor:
        out_NH: torch.Tensor = self.mlp(x_NH)
        return x_NH + out_NH


class FakeHashLayer(nn.Module):
    """A hash-routed MoE layer (A5): real experts, no router for the walk."""

    def __init__(
        self, layer_number: int, hidden_size: int, gate: FakeHashGate, generator: torch.Generator
    ) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.gate = gate
        self.experts = FakeExperts(hidden_size, gate.num_experts, generator)
        self.last_ids_NK: torch.Tensor | None = None

    def forward(self, x_NH: torch.Tensor, token_ids_N: torch.Tensor) -> torch.Tensor:
        probs_NK, ids_NK = self.gate(x_NH, token_ids_N)
        self.last_ids_NK = ids_NK
        out_NH: torch.Tensor = self.experts(x_NH, probs_NK, ids_NK)
        return x_NH + out_NH


class FakeDenseLayer(nn.Module):
    """A dense decoder layer (A2): it keeps its layer number but has no router."""

    def __init__(self, layer_number: int, hidden_size: int, generator: torch.Generator) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.mlp = nn.Linear(hidden_size, hidden_size)
        with torch.no_grad():
            self.mlp.weight.copy_(
                torch.randn(hidden_size, hidden_size, generator=generator) * hidden_size**-0.5
            )
            self.mlp.bias.zero_()

    def forward(self, x_NH: torch.Tensor, token_ids_N: torch.Tensor) -> torch.Tensor:
        return x_NH + torch.tanh(self.mlp(x_NH))


class FakeMixer(nn.Module):
    """A non-MoE block between layers of a hybrid model (a Mamba or attention stand-in), with
    no ``layer_number`` of its own (A6)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)

    def forward(self, x_NH: torch.Tensor, token_ids_N: torch.Tensor) -> torch.Tensor:
        return x_NH + 0.5 * torch.tanh(self.norm(x_NH))


class FakeDecoder(nn.Module):
    """``layers`` run in the order of ``order`` (names of children); by default registration
    order. Hybrid decoders register their children in another order than they run (A6)."""

    def __init__(self, layers: nn.ModuleDict | nn.ModuleList, order: Sequence[str] | None = None):
        super().__init__()
        self.layers = layers
        names = [name for name, _ in layers.named_children()]
        self._order = list(order) if order is not None else names
        if sorted(self._order) != sorted(names):
            raise ValueError(f"order {self._order} must name every child of layers {names}")

    def ordered_layers(self) -> list[nn.Module]:
        children = dict(self.layers.named_children())
        return [children[name] for name in self._order]

    def forward(self, x_NH: torch.Tensor, token_ids_N: torch.Tensor) -> torch.Tensor:
        for layer in self.ordered_layers():
            x_NH = layer(x_NH, token_ids_N)
        return x_NH


class FakeMoEModel(nn.Module):
    """Embedding, ``decoder``, optional ``mtp`` block, vocabulary head: ``forward(token_ids)``
    returns logits ``[..., V]`` (or the hidden state ``[N, H]`` of a chunk that is not the last
    stage). A chunk that is not the first stage takes ``hidden_NH`` from the previous one.
    The MTP block runs after the decoder and leaves its logits in ``last_mtp_logits``."""

    def __init__(
        self,
        decoder: FakeDecoder,
        *,
        hidden_size: int,
        vocab_size: int,
        generator: torch.Generator,
        mtp: FakeDecoder | None = None,
        pre_process: bool = True,
        post_process: bool = True,
    ) -> None:
        super().__init__()
        self.pre_process, self.post_process = pre_process, post_process
        self.embedding = nn.Embedding(vocab_size, hidden_size) if pre_process else None
        self.decoder = decoder
        self.mtp = mtp
        self.output_layer = nn.Linear(hidden_size, vocab_size, bias=False) if post_process else None
        # Both draws always happen, so every pipeline chunk gets the full model's weights.
        embedding_VH = torch.randn(vocab_size, hidden_size, generator=generator)
        output_VH = torch.randn(vocab_size, hidden_size, generator=generator) * hidden_size**-0.5
        with torch.no_grad():
            if self.embedding is not None:
                self.embedding.weight.copy_(embedding_VH)
            if self.output_layer is not None:
                self.output_layer.weight.copy_(output_VH)
        self.last_mtp_logits: torch.Tensor | None = None

    def forward(
        self, token_ids: torch.Tensor, hidden_NH: torch.Tensor | None = None
    ) -> torch.Tensor:
        token_ids_N = token_ids.reshape(-1)
        if self.embedding is not None:
            hidden_NH = self.embedding(token_ids_N)
        elif hidden_NH is None:
            raise ValueError("a chunk without pre_process needs hidden_NH from the previous stage")
        hidden_NH = self.decoder(hidden_NH, token_ids_N)
        if self.output_layer is None:
            return hidden_NH
        if self.mtp is not None:
            self.last_mtp_logits = self.output_layer(self.mtp(hidden_NH, token_ids_N))
        logits_NV: torch.Tensor = self.output_layer(hidden_NH)
        return logits_NV.reshape(*token_ids.shape, -1)

    def routers(self) -> list[FakeTopKRouter]:
        """The decoder's routers in layer order (MTP routers excluded)."""
        found = [m for m in self.decoder.modules() if isinstance(m, FakeTopKRouter)]
        return sorted(found, key=lambda router: router.layer_number)

    def moe_layer_numbers(self) -> tuple[int, ...]:
        """Global layer numbers of the routed (not hash-routed) decoder layers."""
        return tuple(router.layer_number for router in self.routers())

    def routed_ids(self) -> torch.Tensor:
        """``[N, L, K]``: the ids each decoder router chose in the last forward."""
        return stacked_ids(self.routers())


def stacked_ids(routers: Iterable[FakeTopKRouter]) -> torch.Tensor:
    """``[N, L, K]`` from the last forward of ``routers``, in the order given."""
    ids = []
    for router in routers:
        if router.last_ids_NK is None:
            raise ValueError(f"the router of layer {router.layer_number} has not run yet")
        ids.append(router.last_ids_NK)
    return torch.stack(ids, dim=1)


def run_chunks(chunks: Sequence[FakeMoEModel], token_ids: torch.Tensor) -> torch.Tensor:
    """Run pipeline chunks in order, passing the hidden state on, as one pipeline rank would
    see its own chunks if it held every stage (a single-process stand-in for PP / VPP)."""
    hidden_NH: torch.Tensor | None = None
    for chunk in chunks:
        hidden_NH = chunk(token_ids, hidden_NH)
    assert hidden_NH is not None, "no chunks given"
    return hidden_NH
