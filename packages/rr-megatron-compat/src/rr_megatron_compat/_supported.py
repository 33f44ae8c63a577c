"""Every megatron-core and verl version fact of this package, as plain data with no imports.

Read from here by :mod:`rr_megatron_compat._versions` (the flags of the installed line),
``rr doctor`` (``SUPPORTED``, entry point ``rr.supported``), ``rr megatron`` (known issues),
rr-fakes' CPU harness (its shims) and the noxfile, which loads this file by path (one session per
line in ``MEGATRON_LINES``) so that nox never imports torch.
"""

SUPPORTED: dict[str, str] = {"megatron-core": ">=0.12,<0.20"}

#: What rr's hooks depend on, as version specifiers; each is one flag of
#: :class:`rr_megatron_compat.MegatronLine`.
MEGATRON_FEATURES: dict[str, str] = {
    # moe_enable_routing_replay and RouterReplay: the native hook point.
    "native_replay": ">=0.16",
    # The router calls topk_routing_with_score_function; before, topk_softmax_with_capacity.
    "score_function_topk": ">=0.14",
    # TopKRouter.routing(logits, padding_mask=None): Megatron leaves padding rows out of its
    # own statistics.
    "padding_mask": ">=0.16",
    # G1: TopKRouter._apply_expert_bias combines routing_map [T, E] with ~padding_mask [T]
    # without unsqueeze (Megatron issue #6114): it raises when T != E and, when T == E, masks
    # expert e by token e's padding, so the expert-bias counts are silently wrong. Read in
    # 0.16.0, 0.16.1, 0.17.1, 0.18.2, 0.19.0 and 0.19.2; fixed only on Megatron's main (no
    # release carries the fix yet).
    # rr counts in Megatron's place on these lines (correct on fixed code too).
    "expert_bias_padding_unbroadcast": ">=0.16,<0.20",
    # TransformerLayer._maybe_unflatten_for_moe: a packed [mbs * S, 1, H] batch whose
    # PackedSeqParams.tokens_per_sample is S reaches MoE layers as [S, mbs, H], so the router's
    # rows are sample-minor (s * mbs + b), not the packed order rr is armed with (b * S + s).
    # Read in 0.19.0 and 0.19.2 (absent from 0.18.2); rr maps the rows both ways.
    "moe_unflatten_packed": ">=0.19",
}

#: What the CPU harness (rr_fakes.megatron) shims or passes per line, as version specifiers.
HARNESS_FEATURES: dict[str, str] = {
    # moe_utils binds te_general_gemm only when Transformer Engine imports, so the router's
    # gating raises NameError without TE.
    "needs_te_gemm_name": ">=0.13,<0.17",
    # megatron.core.transformer.moe.ops.paged_stash imports triton, undeclared: a stand-in.
    "needs_triton": ">=0.18",
    # Layer specs, GPTModel and the stage predicates take vp_stage; 0.12 reads the virtual
    # pipeline rank from global state.
    "vp_stage_kwarg": ">=0.13",
    # Routers of MTP layers carry is_mtp_layer.
    "router_has_is_mtp_layer": ">=0.17",
}

#: The lines nox tests, on Python 3.11 next to the CPU build of torch: line -> (pinned release,
#: extra pip flags for it, extra packages to install with it).
MEGATRON_LINES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # 0.12.3 pulls ~76 packages (modelopt, wandb, ...); numpy and packaging are all it imports.
    "0.12": ("0.12.3", ("--no-deps",), ("numpy", "packaging")),
    # 0.13.1 imports packaging without declaring it.
    "0.13": ("0.13.1", (), ("packaging",)),
    "0.14": ("0.14.0", (), ()),
    "0.15": ("0.15.3", (), ()),
    "0.16": ("0.16.1", (), ()),
    # 0.17+ declare Requires-Python >=3.12 but publish working cp311 wheels; without
    # --only-binary pip tries to build a numpy sdist.
    "0.17": ("0.17.1", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.18": ("0.18.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.19": ("0.19.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
}

#: The verl release whose Megatron engine ``rr_megatron_compat.verl`` replaces names in, installed
#: with ``--no-deps`` (its declared dependencies pull wandb, tensorboard, hydra, torchdata, ...
#: that the engine module never imports).
VERL_RELEASE = "0.9.1"

#: The megatron-core line that verl's engine is exercised on.
VERL_MEGATRON_LINE = "0.19"

#: What ``import verl.workers.engine.megatron.transformer_impl`` imports beyond torch,
#: megatron-core and their own dependencies; each was removed in turn from a working environment
#: and the import then failed. ``orjson`` and ``omegaconf`` are imported but not declared by verl;
#: ``pillow`` is reached through ``verl.utils.dataset``. Their dependencies come with them.
VERL_IMPORT_DEPS: tuple[str, ...] = (
    "ray==2.60.0",  # verl/__init__ -> verl.protocol
    "tensordict==0.10.0",  # verl.protocol; verl declares >=0.8,<=0.10,!=0.9.0
    "orjson==3.13.0",  # verl.protocol
    "transformers==5.10.4",  # verl.utils.torch_functional; verl declares >=5.5.3,<5.11,!=5.6.0
    "omegaconf==2.3.1",  # verl.utils.config
    "codetiming==1.4.0",  # verl.utils.profiler
    "datasets==4.7.0",  # verl.utils.dataset
    "pillow==13.0.0",  # verl.utils.dataset.rl_dataset
    "peft==0.21.2",  # verl.utils.fsdp_utils, reached from verl.workers.engine
)

#: What verl's agent loop (``verl.experimental.agent_loop``: its rollout-to-trainer conversion of
#: ``routed_experts``) imports beyond :data:`VERL_IMPORT_DEPS`.
VERL_ROLLOUT_DEPS: tuple[str, ...] = (
    "hydra-core==1.3.8",
    "cachetools==8.0.2",
    "uvicorn==0.54.0",
    "fastapi==0.165.0",
)

#: The Megatron-Bridge release whose real models (built through its own random-init path, as
#: verl's engine builds them) the ``bridge`` nox session replays, with ``--no-deps``: its
#: declared dependencies pull wandb, mlflow, flashinfer, Transformer Engine extras, ... that
#: building and running a model never imports. It declares Requires-Python >=3.12 but the wheel
#: is pure Python: without --ignore-requires-python pip on 3.11 silently picks 0.3.1 (read with
#: ``pip download``); --only-binary as for megatron-core 0.17+.
BRIDGE_RELEASE = "0.6.2"
BRIDGE_PIP_FLAGS: tuple[str, ...] = ("--no-deps", "--ignore-requires-python", "--only-binary=:all:")

#: The megatron-core line the bridge models are built on (a key of MEGATRON_LINES).
BRIDGE_MEGATRON_LINE = "0.19"

#: What ``import megatron.bridge`` imports beyond torch, megatron-core and their own
#: dependencies; each was removed in turn from a working environment and the import then
#: failed. (On Python 3.11 it also needs ``typing.override``, which rr-fakes' CPU harness
#: backports from typing_extensions while bridge imports and builds.)
BRIDGE_IMPORT_DEPS: tuple[str, ...] = (
    "transformers==5.10.4",  # bridge's HF configs; bridge declares >=5.8,<=5.12.1, verl's pin
    "einops==0.8.2",  # megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention
    "omegaconf==2.3.1",  # megatron.bridge.models.config
)

#: MEGATRON_FEATURES["expert_bias_padding_unbroadcast"], as ``rr megatron`` says it.
_G1_EXPERT_BIAS = (
    "expert-bias counts with a padding_mask: routing_map & ~padding_mask without unsqueeze "
    "raises when tokens != experts and miscounts when equal (G1, Megatron #6114; rr counts in "
    "its place)"
)

#: Known issues of each line that matter to replay (``rr megatron`` prints them).
KNOWN_ISSUES: dict[str, tuple[str, ...]] = {
    "0.12": (
        "no TopKRouter.is_aux_loss_enabled; compute_routing_scores_for_aux_loss, "
        "group_limited_topk and apply_router_token_dropping are not all module functions "
        "(a grouped import of them fails as a whole: C6)",
        "get_transformer_layer_offset / get_num_layers_to_build take no vp_stage / pp_rank",
        "routing goes through topk_softmax_with_capacity (capacity applied after selection: C3)",
    ),
    "0.13": (
        "routing goes through topk_softmax_with_capacity",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.14": (
        "moe_router_fusion returns before any top-k hook (C2)",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.15": (
        "moe_router_fusion returns before any top-k hook (C2)",
        "moe_utils.te_general_gemm is unbound without Transformer Engine",
    ),
    "0.16": (
        "native RouterReplay: process-global list in construction order (orphans first when a "
        "model is built twice: A1), FIFO backward targets (B1), fusion skips it silently (C2)",
        "alltoall dispatcher sizes dropless output as tokens * topk (C1)",
        _G1_EXPERT_BIAS,
    ),
    "0.17": (
        "native RouterReplay as in 0.16; MTP routers carry is_mtp_layer",
        _G1_EXPERT_BIAS,
    ),
    "0.18": (
        "native RouterReplay as in 0.16",
        "import needs triton (undeclared)",
        _G1_EXPERT_BIAS,
    ),
    "0.19": (
        "native RouterReplay gains layer_number",
        "PackedSeqParams.tokens_per_sample re-orders a packed batch's router rows to [S, mbs] "
        "(rr maps armed and recorded rows back to packed order)",
        "import needs triton (undeclared)",
        _G1_EXPERT_BIAS,
    ),
}
