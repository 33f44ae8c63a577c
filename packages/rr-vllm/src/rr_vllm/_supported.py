"""Every vLLM and SGLang version fact of rr-vllm, as plain data with no imports: the supported
range (``rr doctor`` reads ``SUPPORTED``, entry point ``rr.supported``), what changed between
releases (:mod:`rr_vllm._versions` turns it into flags), SGLang's capture fields, and the release
the real-class tests pin, which the noxfile reads by path (so nox never imports torch)."""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"vllm": ">=0.14,<0.34"}

#: vLLM behaviours that changed across releases (``vllm-facts.md``), as version specifiers; each
#: becomes one boolean of :class:`rr_vllm._versions.VllmFlags`.
VLLM_FEATURES: dict[str, str] = {
    # CompletionOutput.routed_experts exists (engine flag enable_return_routed_experts).
    "capture": ">=0.14",
    # Ids are logical (before expert-load-balancing remaps); 0.14-0.15 returned physical ids.
    "logical_ids": ">=0.16",
    # Prompt rows in RequestOutput.prompt_routed_experts, generation rows alone in the
    # completion (int16, MoE layers only, -1 for prefix-cached rows, None after preemption).
    "split_arrays": ">=0.21,<0.22",
    # SamplingParams.routed_experts_prompt_start.
    "prompt_start": ">=0.22",
    # Buffers sized right for hybrid-attention models (several KV-cache groups).
    "hybrid_attention": ">=0.22",
    # uint8 ids when E <= 256, else uint16.
    "compact_dtype": ">=0.22",
    # Capture goes through the aux-output store: AuxOutputConfig(max_bytes), prefix caching
    # required, BlockObjectStoreError when a prefix hit needs evicted rows.
    "aux_output_store": ">=0.32",
    # routed_experts_prompt_start == P (the whole prompt) is served, as an empty prompt slice
    # (vLLM PR #56844). 0.22.0-0.29.x assert prompt_start < P in the scheduler
    # (vllm/v1/core/sched/scheduler.py of each wheel), which kills the EngineCore: that request
    # and every later one answer HTTP 500 (vLLM #55750, G4).
    "prompt_start_whole_prompt": ">=0.30",
    # /inference/v1/generate with stream=true sends routed_experts (base64 .npy, the whole
    # request's rows) on the chunk that carries finish_reason (vLLM PR #44638; the stream choice
    # has the field from 0.24.0). The OpenAI streaming choices have no such field (RFC #56745).
    "stream_routes": ">=0.24",
}

#: SGLang's request fields for capture (server flag ``--enable-return-routed-experts``).
SGLANG_FIELDS: tuple[str, ...] = ("return_routed_experts", "routed_experts_start_len")

#: The release the real-class tests run against, installed with ``--no-deps`` (its full set pins
#: another torch and CUDA-only packages) plus the light pure-Python packages that let
#: ``vllm.outputs``, ``vllm.sampling_params`` and ``vllm.engine.arg_utils`` import on CPU torch.
TESTED_VLLM = "0.33.0"
VLLM_IMPORT_DEPS: tuple[str, ...] = (
    "packaging", "msgspec", "pydantic", "regex", "cbor2", "psutil", "pyzmq",
    "transformers>=5.16.1,<5.21", "aiohttp", "requests", "openai-harmony", "openai",
    "prometheus_client", "pillow", "pybase64", "cachetools", "cloudpickle", "uvloop", "py-cpuinfo",
)  # fmt: skip

#: TensorRT-LLM's capture (NVIDIA/TensorRT-LLM PR #18397, merged 2026-08; no release is pinned):
#: ``CompletionOutput.routed_experts`` ``(seq_len - 1, num_moe_layers, top_k)``, MoE layers only,
#: logical ids; the ``finish_reason`` values rr reads as an aborted request.
TRTLLM_CANCELLED: tuple[str, ...] = ("cancelled",)

#: The R3/v1 router-replay envelope (eval-protocol/python-sdk PR #450): header versions decoded,
#: and the optional extra that brings its zstd decompressor.
R3V1_VERSIONS: tuple[int, ...] = (1,)
R3V1_EXTRA = "r3v1"
