"""Every megatron-core version fact rr_megatron_compat acts on, as plain data with no imports:
the supported range, the features rr's hooks depend on and each line's known issues.

Read from here by :mod:`rr_megatron_compat._versions` (the flags of the installed line),
``rr doctor`` (``SUPPORTED``, entry point ``rr.supported``) and ``rr megatron`` (known issues).
The releases the tests pin per line, and what the CPU harness shims, are the harness's data
(:mod:`rr_fakes.pins`).
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
