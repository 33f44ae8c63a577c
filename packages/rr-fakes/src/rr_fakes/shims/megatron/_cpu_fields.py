"""The ``TransformerConfig`` fields every CPU build of a Megatron model sets (data only, so verl's
job reads them without importing torch): the fusions are Transformer Engine or torch.compile'd
kernels (plain torch paths instead), experts run as SequentialMLP (grouped GEMM needs TE or the
grouped_gemm package), CPU initialisation."""

CPU_TRANSFORMER_FIELDS: dict[str, bool] = {
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "use_cpu_initialization": True,
}
