"""The two Megatron-Bridge models the bridge tests build, tiny, and what the tests read off every
router of them (live, orphan, MTP).

Each is built through bridge's own random-initialisation path
(``rr_fakes.shims.megatron.bridge_shims.provide_model``): Qwen3-VL MoE, whose language model bridge
builds twice (``Qwen3VLGPTModel`` runs ``GPTModel.__init__``, which builds a decoder, then replaces
it with its own block; the first block's routers stay registered in Megatron's global
``RouterReplay`` list, ahead of the live ones), and Qwen3.5 MoE with one MTP layer (its router is
numbered 1, like the first decoder layer's). ``Built`` sorts a built model's routers; ``watch``
reads what each did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import rr_megatron_compat as rmc
from rr_core import RouteMeta, controller_of, walk_routers
from rr_fakes import RolloutEmulator, VllmEra
from rr_fakes.shims.megatron import map_ids
from rr_fakes.shims.megatron.bridge_shims import provide_model

E, K, VOCAB = 8, 2, 128


def _qwen3_vl_moe(num_layers: int) -> Any:
    import transformers

    return transformers.Qwen3VLMoeConfig(
        architectures=["Qwen3VLMoeForConditionalGeneration"],
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_hidden_layers": num_layers,
            "num_experts": E,
            "num_experts_per_tok": K,
            "vocab_size": VOCAB,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "mrope_section": [2, 3, 3],  # sums to head_dim / 2
            },
        },
        vision_config={  # read by the provider; the tower itself is not built (add_encoder)
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "deepstack_visual_indexes": [0],
        },
    )


def _qwen35_moe(num_layers: int) -> Any:
    import transformers

    return transformers.Qwen3_5MoeTextConfig(
        architectures=["Qwen3_5MoeForCausalLM"],
        hidden_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_hidden_layers=num_layers,
        layer_types=["linear_attention"] * (num_layers - 1) + ["full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=E,
        num_experts_per_tok=K,
        vocab_size=VOCAB,
        mtp_num_hidden_layers=1,  # bridge maps it to mtp_num_layers
    )


def _local_gpt_spec() -> Any:
    from megatron.bridge.models.gpt_provider import local_layer_spec

    return local_layer_spec


@dataclass(frozen=True)
class BridgeModel:
    """One bridge architecture, tiny: its HF config and the provider overrides a CPU build
    needs (each says why)."""

    name: str
    num_layers: int
    orphans: bool  # the language model is built twice
    mtp: bool
    overrides: dict[str, Any] = field(default_factory=dict)

    def hf_config(self) -> Any:
        return (_qwen3_vl_moe if self.name == "qwen3_vl_moe" else _qwen35_moe)(self.num_layers)

    def provider_overrides(self) -> dict[str, Any]:
        extra = dict(self.overrides)
        if self.name == "qwen35_moe":
            # Gated DeltaNet (linear attention) and its block spec exist only with Transformer
            # Engine: every layer gets Megatron's local attention (routing is unchanged); the
            # local RMSNorm has no zero-centred gamma.
            extra.update(
                transformer_layer_spec=_local_gpt_spec(),
                experimental_attention_variant=None,
                linear_attention_freq=None,
                layernorm_zero_centered_gamma=False,
            )
        return extra


QWEN3_VL_MOE = BridgeModel(
    "qwen3_vl_moe",
    num_layers=3,
    orphans=True,
    mtp=False,
    # the vision tower off (text-only batches); bridge's MoE-VL provider freezes the language
    # model by default, R2 / R3 train it
    overrides={"add_encoder": False, "freeze_language_model": False, "freeze_vision_model": False},
)
QWEN35_MOE_MTP = BridgeModel("qwen35_moe", num_layers=2, orphans=False, mtp=True)
MODELS = (QWEN3_VL_MOE, QWEN35_MOE_MTP)


def build(model: BridgeModel, extra: Mapping[str, Any] | None = None) -> nn.Module:
    """The model's one chunk (no pipelining), replay enabled as verl's engine enables it;
    ``extra`` sets any other provider field."""
    overrides = {**rmc.replay_config_fields(), **model.provider_overrides(), **(extra or {})}
    (chunk,) = provide_model(model.hf_config(), overrides)
    return chunk


def all_routers(chunk: nn.Module) -> list[nn.Module]:
    """Every TopKRouter module inside ``chunk`` (live decoder, MTP, none orphaned: orphans are
    no longer reachable from the model)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in chunk.modules() if isinstance(m, TopKRouter)]


def mtp_routers(chunk: nn.Module) -> list[nn.Module]:
    return [r for r in all_routers(chunk) if getattr(r, "is_mtp_layer", False)]


def registered() -> list[Any]:
    """Megatron's process-global RouterReplay list (0.16+), in construction order."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    return list(RouterReplay.global_router_replay_instances)


class Calls:
    """What each watched router did, call by call: the ids it used and the native top-k of its
    own scores for the same input (its gating recomputed on the input it got)."""

    def __init__(self) -> None:
        self.used: dict[int, list[torch.Tensor]] = {}
        self.native: dict[int, list[torch.Tensor]] = {}

    def count(self, router: nn.Module) -> int:
        return len(self.used.get(id(router), []))

    def rows(self, router: nn.Module) -> torch.Tensor:
        """Ids ``[rows, K]`` (ascending per row) of every forward call, in call order."""
        return torch.cat(self.used[id(router)])

    def native_rows(self, router: nn.Module) -> torch.Tensor:
        return torch.cat(self.native[id(router)])


@contextlib.contextmanager
def watch(routers: Sequence[nn.Module]) -> Iterator[Calls]:
    """Record every forward call of ``routers`` (not the backward recompute)."""
    calls = Calls()

    def hook(router: nn.Module, args: Any, output: Any) -> None:
        if torch._C._current_graph_task_id() != -1:  # recompute inside backward
            return
        with torch.no_grad():
            logits = router.gating(args[0]).view(-1, router.config.num_moe_experts)
            native = logits.topk(router.topk, dim=-1).indices.sort(-1).values
        calls.used.setdefault(id(router), []).append(map_ids(output[1].detach()))
        calls.native.setdefault(id(router), []).append(native)

    with contextlib.ExitStack() as hooks:
        for router in routers:
            hooks.enter_context(router.register_forward_hook(hook))
        yield calls


def check_native_scoring(chunk: nn.Module) -> None:
    """What makes ``Calls.native`` Megatron's own selection: softmax after top-k (top-k of the
    logits), no expert bias, no group limit, no capacity."""
    config = chunk.config
    assert config.moe_router_score_function == "softmax"
    assert not config.moe_router_pre_softmax
    assert not config.moe_router_enable_expert_bias
    assert config.moe_router_num_groups in (None, 1)
    assert config.moe_expert_capacity_factor is None


def perturb(routers: Sequence[nn.Module], seed: int = 1) -> None:
    """Move the router weights so native routing differs from what was recorded."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in routers:
            router.weight.add_(torch.randn(router.weight.shape, generator=g))


def token_batch(lengths: Sequence[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Sequences packed into one row ``[1, T]`` (verl's layout; the router rows follow it)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": positions, "labels": ids.roll(-1, 1)}


def loss(chunk: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out: torch.Tensor = chunk(
        batch["input_ids"], batch["position_ids"], attention_mask=None, labels=batch["labels"]
    )
    return out.float().mean()


def logits(chunk: nn.Module, ids_1S: torch.Tensor) -> torch.Tensor:
    """Logits ``[1, S, V]`` of the token ids (the rollout engine's forward)."""
    positions = torch.arange(ids_1S.shape[1]).unsqueeze(0)
    out: torch.Tensor = chunk(ids_1S, positions, attention_mask=None)
    return out


class Built:
    """A bridge model with its routers sorted: live decoder routers in layer order, MTP routers,
    and the RouterReplay objects registered for routers that are not in the model (orphans)."""

    def __init__(self, spec: BridgeModel, extra: Mapping[str, Any] | None = None) -> None:
        start = len(registered())
        self.chunk = build(spec, extra)
        self.registered = registered()[start:]
        self.live = [router for _, router in walk_routers(self.chunk)]
        self.layers = tuple(router.layer_number for router in self.live)
        self.mtp = mtp_routers(self.chunk)
        ours = {id(getattr(r, "router_replay", None)) for r in all_routers(self.chunk)}
        self.orphans = [i for i in self.registered if id(i) not in ours]
        assert bool(self.orphans) == spec.orphans
        assert bool(self.mtp) == spec.mtp
        check_native_scoring(self.chunk)

    def check_untouched_and_native(self, calls: Calls) -> None:
        for replay in self.orphans:
            assert replay.router_replay_action is None
            assert replay.target_topk_idx is None
            assert replay.recorded_topk_idx is None
        for router in self.mtp:
            assert controller_of(router) is None
            assert calls.count(router) > 0, "the MTP layer never routed"
            assert torch.equal(calls.rows(router), calls.native_rows(router))


def assert_replayed(built: Built, calls: Calls, routes_TLK: torch.Tensor) -> None:
    """Each live router used its slot of ``routes_TLK`` on every row, and at least one would
    have chosen otherwise (so replay, not chance, made them equal)."""
    for slot, router in enumerate(built.live):
        wanted = routes_TLK[:, slot].long().sort(-1).values
        assert torch.equal(calls.rows(router), wanted), f"layer {router.layer_number}"
    moved = [not torch.equal(calls.rows(r), calls.native_rows(r)) for r in built.live]
    assert any(moved), "native routing equals the target: the test cannot see replay"


def rollout_routes(built: Built, prompt: list[int]) -> tuple[Any, torch.Tensor]:
    """A noisy greedy rollout on the model and its routes ``[T-1, layers, K]`` as rr_vllm
    decodes vLLM's output (all-layers axis; every layer is MoE here)."""
    from rr_vllm import DecodeOptions, decode_vllm_output

    built.chunk.eval()
    emulator = RolloutEmulator(built.chunk, E, K, noise=0.5, seed=3, forward=logits)
    rollout = emulator.generate(prompt, max_new_tokens=6)
    built.chunk.train()
    meta = RouteMeta(
        num_experts=E,
        top_k=K,
        layer_axis="all_layers",
        layer_numbers=built.layers,
        moe_layer_numbers=built.layers,
    )
    routes = decode_vllm_output(rollout.vllm_output(VllmEra.V0_32), DecodeOptions(meta=meta))
    values_TLK, valid_T = routes.to_batch().sequence(0)
    rows = len(rollout.token_ids) - 1  # the last sampled token is never fed
    assert bool(valid_T[:rows].all())
    assert torch.equal(values_TLK[:rows].long(), torch.from_numpy(rollout.routes_TLK))
    return rollout, values_TLK[:rows]


def fed(rollout: Any) -> dict[str, torch.Tensor]:
    """The rollout as the trainer feeds it: every token but the last, next-token labels."""
    ids = torch.tensor([rollout.token_ids])
    return {
        "input_ids": ids[:, :-1],
        "position_ids": torch.arange(ids.shape[1] - 1).unsqueeze(0),
        "labels": ids[:, 1:],
    }
