"""verl's real Megatron engine over tiny GPTModels on CPU.

``MegatronEngine.__init__`` and ``initialize()`` load a Hugging Face checkpoint through
Megatron-Bridge, build the model with DDP and an optimizer, and set up device meshes: none of
that exists for a tiny random model on a machine without GPUs. :func:`verl_engine` creates the
engine with ``object.__new__`` instead and sets the attributes its training path reads
(``forward_backward_batch`` -> ``forward_step`` -> ``postprocess_micro_batch_func`` ->
``_lm_head_logits_processor``); every one of those methods is verl's own, unchanged.

The one part of ``__init__`` that matters for routing, ``apply_router_replay_patch()``, must run
before the routers exist (it rewrites ``TopKRouter.__init__``), so :func:`build_verl_chunks`
calls it, as verl does, before building the model. :func:`verl_cpu` puts back on exit what that
patch rewrote on Megatron's classes, so one test's patch never reaches another.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from rr_core import LayoutConfig, moe_pattern
from rr_fakes.shims.megatron._gpt import TinyGPTConfig, build_gpt_chunks
from rr_fakes.shims.megatron._nested import outermost_under_megatron_cpu
from rr_fakes.shims.megatron._shims import megatron_cpu
from rr_fakes.shims.verl._attention import use_thd_attention

Mode = Literal["disabled", "R2", "R3"]
MODES: tuple[str, ...] = ("disabled", "R2", "R3")

#: verl's Megatron engine module (the one the harness drives).
ENGINE_MODULE = "verl.workers.engine.megatron.transformer_impl"

_MISSING = object()


@functools.cache
def unavailable_reason() -> str | None:
    """Why verl's Megatron engine cannot be imported here, or None when it can (cached)."""
    try:
        with megatron_cpu(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(ENGINE_MODULE)
    except ImportError as error:
        return f"verl's Megatron engine unavailable: {error!r}"
    return None


def _replay_patch_targets() -> list[tuple[Any, str]]:
    """Every (owner, attribute) that ``apply_router_replay_patch`` may set on Megatron."""
    router = importlib.import_module("megatron.core.transformer.moe.router")
    config = importlib.import_module("megatron.core.transformer.transformer_config")
    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    targets: list[tuple[Any, str]] = [
        (router.TopKRouter, name)
        for name in ("__init__", "routing", "_hash_routing", "_router_replay_patched")
    ]
    targets += [(router, "RouterReplay")]
    targets += [(config.TransformerConfig, n) for n in ("__init__", "_verl_router_patched")]
    targets += [(config.TransformerConfig.__init__, "__signature__")]
    alltoall = dispatcher.MoEAlltoAllTokenDispatcher
    targets += [(alltoall, n) for n in ("preprocess", "_preprocess_patched")]
    return targets


@outermost_under_megatron_cpu
def verl_cpu() -> Iterator[None]:
    """:func:`rr_fakes.shims.megatron.megatron_cpu` with verl's engine module imported, and on exit
    Megatron's router, config and dispatcher classes as they were on entry (verl's router
    replay patch rewrites them for the whole process), verl's router registry emptied and
    Megatron's own one as it was.
    Nested entries share the outer one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns about every engine it cannot load
        importlib.import_module(ENGINE_MODULE)
    saved = [
        (owner, name, vars(owner).get(name, _MISSING)) for owner, name in _replay_patch_targets()
    ]
    # On megatron-core 0.19 verl turns on Megatron's own replay flag, so every router built
    # under its patch first registers a native RouterReplay that verl then replaces.
    native = _native_registry()
    native_before = list(native) if native is not None else []
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            if original is _MISSING:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)
        _router_replay().router_instances.clear()
        if native is not None:
            native[:] = native_before


def _native_registry() -> list[Any] | None:
    """Megatron's own process-global router replay registry (0.16+), or None."""
    try:
        module = importlib.import_module("megatron.core.transformer.moe.router_replay")
    except ImportError:
        return None
    registry: list[Any] | None = getattr(
        module.RouterReplay, "global_router_replay_instances", None
    )
    return registry


def _router_replay() -> Any:
    return importlib.import_module("verl.utils.megatron.router_replay_patch").RouterReplay


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")


def build_verl_chunks(config: TinyGPTConfig, *, mode: Mode) -> list[nn.Module]:
    """This rank's GPTModel chunks as verl's engine builds them for ``mode``: with replay on,
    verl's ``apply_router_replay_patch()`` first (MegatronEngine.__init__ does it before the
    model exists) and the replay flag on the config (``moe_enable_routing_replay`` where the
    Megatron line has it, else verl's ``enable_routing_replay``, as ``_build_tf_config``
    chooses); verl's schedule overrides (``variable_seq_lengths=True``: stages exchange shapes,
    the schedule is called with ``seq_length=1``; ``overlap_p2p_comm`` with VPP,
    ``batch_p2p_comm=False``); and :class:`ThdCoreAttention` in
    place of Transformer Engine's packed attention. Call inside :func:`verl_cpu` and
    :func:`rr_fakes.shims.megatron.model_parallel`."""
    _check_mode(mode)
    ps = importlib.import_module("megatron.core.parallel_state")
    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    # verl's provider overrides for the schedule: shapes travel with the activations, and
    # interleaved stages overlap their p2p exchange with compute.
    extra: dict[str, Any] = {
        "variable_seq_lengths": True,
        "overlap_p2p_comm": vpp is not None and vpp > 1,
        "batch_p2p_comm": False,
    }
    if mode != "disabled":
        importlib.import_module(
            "verl.utils.megatron.router_replay_patch"
        ).apply_router_replay_patch()
        tc = importlib.import_module("megatron.core.transformer.transformer_config")
        names = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
        flag = (
            "moe_enable_routing_replay"
            if "moe_enable_routing_replay" in names
            else "enable_routing_replay"
        )
        extra[flag] = True
    extra.update(config.extra)
    chunks = build_gpt_chunks(dataclasses.replace(config, extra=extra))
    use_thd_attention(chunks)
    return chunks


@dataclass(frozen=True)
class Tokenizer:
    """The one tokenizer attribute the engine's forward reads."""

    pad_token_id: int = 0


@dataclass
class ModelConfig:
    """What the engine's training path reads of verl's ``HFModelConfig`` (which loads a
    checkpoint directory in ``__post_init__``): the HF config (its architecture picks verl's
    GPT forward), the MTP switches, the tokenizer's pad id and the model type."""

    hf_config: Any
    mtp: Any
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    model_type: str = "language_model"
    share_embeddings_and_output_weights: bool = False


def _hf_config(tf_config: Any, vocab_size: int, architecture: str) -> Any:
    """A real transformers config of the Qwen3-MoE family, sized like ``tf_config``."""
    transformers = importlib.import_module("transformers")
    layout = LayoutConfig(num_layers=tf_config.num_layers, moe_layer_freq=tf_config.moe_layer_freq)
    dense = [i for i, moe in enumerate(moe_pattern(layout)) if not moe]
    return transformers.AutoConfig.for_model(
        "qwen3_moe",
        architectures=[architecture],
        vocab_size=vocab_size,
        hidden_size=tf_config.hidden_size,
        intermediate_size=tf_config.ffn_hidden_size,
        moe_intermediate_size=tf_config.moe_ffn_hidden_size or tf_config.ffn_hidden_size,
        num_hidden_layers=tf_config.num_layers,
        num_attention_heads=tf_config.num_attention_heads,
        num_key_value_heads=tf_config.num_query_groups or tf_config.num_attention_heads,
        num_experts=tf_config.num_moe_experts,
        num_experts_per_tok=tf_config.moe_router_topk,
        mlp_only_layers=dense,
        tie_word_embeddings=False,
    )


def verl_engine(
    chunks: Sequence[nn.Module],
    tf_config: Any = None,
    *,
    mode: Mode,
    use_remove_padding: bool = True,
    architecture: str = "Qwen3MoeForCausalLM",
    pad_token_id: int = 0,
    engine_overrides: dict[str, Any] | None = None,
) -> Any:
    """A real ``MegatronEngineWithLMHead`` over ``chunks`` (this rank's model chunks, a list
    with one per virtual pipeline stage, as verl holds them in ``self.module``) without its
    bridge / checkpoint / optimizer init. ``tf_config`` defaults to the chunks' own config.
    ``engine_config`` is a real ``McoreEngineConfig`` with ``router_replay.mode=mode`` and the
    parallel sizes of Megatron's initialised state; ``engine_overrides`` sets any other field.
    With replay on, the chunks must come from :func:`build_verl_chunks` with the same mode.
    """
    _check_mode(mode)
    impl = importlib.import_module(ENGINE_MODULE)
    configs = importlib.import_module("verl.workers.config")
    engine_configs = importlib.import_module("verl.workers.config.engine")
    ps = importlib.import_module("megatron.core.parallel_state")
    chunks = list(chunks)
    if not chunks:
        raise ValueError("no model chunks")
    tf_config = chunks[0].config if tf_config is None else tf_config
    if mode != "disabled":
        _check_routers_replay(chunks)
    settings: dict[str, Any] = {
        "strategy": "megatron",
        "dtype": "bfloat16",  # validated by verl; read only by the skipped _build_tf_config
        "use_remove_padding": use_remove_padding,
        "router_replay": engine_configs.EngineRouterReplayConfig(mode=mode),
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "virtual_pipeline_model_parallel_size": ps.get_virtual_pipeline_model_parallel_world_size(),
        "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
        "context_parallel_size": ps.get_context_parallel_world_size(),
    }
    settings.update(engine_overrides or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "set sequence parallel to false as TP size is 1"
        engine_config = configs.McoreEngineConfig(**settings)
    vocab_size = _vocab_size(chunks)
    engine = object.__new__(impl.MegatronEngineWithLMHead)
    engine.engine_config = engine_config
    engine.model_config = ModelConfig(
        hf_config=_hf_config(tf_config, vocab_size, architecture),
        mtp=configs.MtpConfig(),
        tokenizer=Tokenizer(pad_token_id),
    )
    engine.tf_config = tf_config
    engine.module = chunks
    for name, value in _ENGINE_STATE.items():
        setattr(engine, name, value)
    engine.enable_routing_replay = mode != "disabled"
    if engine.enable_routing_replay:
        engine.mini_layer_topk_idx_list = []
    return engine


#: The rest of the state verl's engine ``__init__`` sets, as an engine without an optimizer,
#: checkpointing, offloading, quantisation or weight export has it.
_ENGINE_STATE: dict[str, Any] = {
    **dict.fromkeys(("optimizer_config", "checkpoint_config", "mode", "weight_converter")),
    **dict.fromkeys(("_qat_config", "_hf_export_tasks")),
    **dict.fromkeys(("is_value_model", "share_embeddings_and_output_weights"), False),
    **dict.fromkeys(("_is_offload_param", "_is_offload_optimizer", "_qat_enabled"), False),
}


def _vocab_size(chunks: Sequence[nn.Module]) -> int:
    for chunk in chunks:
        size = getattr(chunk, "vocab_size", None)
        if size:
            return int(size)
    raise ValueError("the chunks carry no vocab_size")


def _check_routers_replay(chunks: Sequence[nn.Module]) -> None:
    """With replay on, every decoder router must hold verl's RouterReplay (built after the
    patch, with the replay flag on its config)."""
    router_cls = importlib.import_module("megatron.core.transformer.moe.router").TopKRouter
    replay_cls = _router_replay()
    routers = [
        m
        for chunk in chunks
        for m in getattr(chunk, "decoder", chunk).modules()
        if isinstance(m, router_cls)
    ]
    if not replay_cls.__module__.startswith("verl."):
        # verl's names were switched to another implementation (rr_megatron_compat.verl):
        # its routers only need a replay object, whoever owns it
        wrong = [r.layer_number for r in routers if getattr(r, "router_replay", None) is None]
    else:
        wrong = [r.layer_number for r in routers if not isinstance(r.router_replay, replay_cls)]
    if wrong:
        raise ValueError(
            f"routers of layers {wrong} hold no verl RouterReplay; build the chunks with "
            "build_verl_chunks(config, mode=...) inside verl_cpu()"
        )
