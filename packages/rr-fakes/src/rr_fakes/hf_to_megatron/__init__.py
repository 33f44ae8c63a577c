"""Public API: a Hugging Face MoE checkpoint as a real megatron-core ``GPTModel`` on CPU (run
under :mod:`rr_fakes.shims.megatron`), by rr's own mapping or by Megatron-Bridge's conversion.

The same weights then run in vLLM, in transformers and in Megatron, so a rollout's routes can be
replayed in Megatron on the model that produced them. Two ways in:

- rr's loader, :func:`build_hf_gpt` (``path`` -> ``(GPTModel, HFGPTSpec)``): the architecture
  read from ``config.json`` (:func:`read_hf_config`, :func:`hf_gpt_spec`; the table of HF config
  keys and megatron-core fields is the docstring of ``_architecture``), the model built with
  Megatron's local (non Transformer Engine) specs (:func:`build_gpt_for`), the checkpoint's
  ``model.safetensors`` copied in, every tensor placed exactly once (:func:`read_hf_state`,
  :func:`megatron_state`, :func:`load_hf_weights`). Families (:data:`HF_LOADER_FAMILIES`):
  ``qwen3_moe``, ``qwen2_moe`` (its gated shared expert), ``mixtral``, ``olmoe`` (q / k norms
  over all heads at once), ``glm4_moe`` (sigmoid scores with a selection bias, grouped top-k,
  partial RoPE, ungated shared experts; grouped only where ``num_experts_per_tok = 2 *
  topk_group``, the one case where Megatron's group scores equal HF's and vLLM's) and
  ``deepseek_v3`` (that router, with MLA and a core attention Megatron's local spec lacks).
  Anything else raises :class:`UnsupportedCheckpointError` naming the family or setting.
  Call it inside :func:`model_parallel` (one rank: no tensor, pipeline or expert parallelism).
- Megatron-Bridge's own conversion, :func:`convert_hf_checkpoint` (``AutoBridge``, bridge's
  weight mapping), with what each family takes in :data:`BRIDGE_FAMILIES` and the families
  bridge 0.6.2 has no converter for in :data:`BRIDGE_UNSUPPORTED`. Call it inside
  :func:`bridge_cpu` and :func:`model_parallel`.

Importing this module imports torch only; megatron-core (and Megatron-Bridge) load on first use.
This is the one rr-fakes module with a compatibility promise: its names stay here, and a name
that moves keeps its old path for one release with a ``DeprecationWarning``.
"""

from rr_fakes.hf_to_megatron._architecture import (
    HF_LOADER_FAMILIES,
    HFGPTSpec,
    UnsupportedCheckpointError,
    hf_gpt_spec,
    read_hf_config,
)
from rr_fakes.hf_to_megatron._bridge import (
    BRIDGE_FAMILIES,
    BRIDGE_UNSUPPORTED,
    BridgeFamily,
    convert_hf_checkpoint,
)
from rr_fakes.hf_to_megatron._loader import build_gpt_for, build_hf_gpt
from rr_fakes.hf_to_megatron._weights import load_hf_weights, megatron_state, read_hf_state
from rr_fakes.shims.megatron._dist import model_parallel
from rr_fakes.shims.megatron.bridge_shims import bridge_cpu

__all__ = [
    "BRIDGE_FAMILIES",
    "BRIDGE_UNSUPPORTED",
    "HF_LOADER_FAMILIES",
    "BridgeFamily",
    "HFGPTSpec",
    "UnsupportedCheckpointError",
    "bridge_cpu",
    "build_gpt_for",
    "build_hf_gpt",
    "convert_hf_checkpoint",
    "hf_gpt_spec",
    "load_hf_weights",
    "megatron_state",
    "model_parallel",
    "read_hf_config",
    "read_hf_state",
]
