"""Catalogue entries: Capture-side failures (E): what an engine's capture gets wrong."""

from __future__ import annotations

from rr_core.failures.mode import FailureMode

ENTRIES = (
    # -- E -------------------------------------------------------------------------------------
    FailureMode(
        "E1",
        "All-zero or missing routes returned as valid",
        "A layer's routes are all zeros; replay sends every token to expert 0.",
        "The capturer was bound too late, a monolithic kernel bypassed it, or a fork returned "
        "an empty buffer.",
        "Validation refuses a MoE slot that is zero on every valid row of a sequence "
        "(RouteValidationError), unless allow_all_zero=True says it is intended.",
    ),
    FailureMode(
        "E2",
        "Physical instead of logical expert ids",
        "Ids above the model's expert count, or valid-looking ids that name replica slots.",
        "With expert-load-balancing, older engines return the physical slot of a replicated "
        "expert instead of its logical id.",
        "Ids outside [0, E) are refused; rr_vllm refuses ids at or above the logical expert "
        "count and refuses capture with EPLB on engine versions known to return physical ids.",
    ),
    FailureMode(
        "E3",
        "Undersized capture buffers with hybrid attention",
        "Captured routes are truncated or garbage for hybrid-attention models.",
        "Older engines size the capture buffer for one KV-cache group.",
        "rr_vllm refuses capture on hybrid-attention models for engine versions before the fix "
        "(CaptureError naming the version needed).",
    ),
    FailureMode(
        "E4",
        "uint8 overflow above 256 experts",
        "Ids wrap modulo 256: expert 300 is replayed as expert 44.",
        "Routes were stored as uint8 for a model with more than 256 experts.",
        "narrow_ids refuses ids that arrive in a dtype too small for the expert count and any "
        "cast that would change a value; rr stores ids in the narrowest dtype that holds them "
        "exactly.",
    ),
    FailureMode(
        "E5",
        "Version-specific capture formats",
        "Routes of one engine version decoded with another version's rules: wrong rows, or -1 ids.",
        "One engine line returns prompt and generation routes as separate arrays, with -1 for "
        "prefix-cached rows and None after preemption.",
        "rr_vllm decodes per engine version; cached-prefix rows become invalid rows and None "
        "after preemption raises.",
    ),
    FailureMode(
        "E6",
        "Draft / MTP model overwrites layer 0",
        "Layer 1's routes are valid ids that disagree with what the trainer's router would pick.",
        "A speculative-decoding draft model writes into the target model's capture of layer 0.",
        "The ids are valid, so no id check can see this; the per-layer agreement in rr's step "
        "report shows the first layer far below the others. Capture with speculative decoding "
        "off.",
    ),
    # -- E: engine configurations that corrupt the capture (refused by rr_vllm) ---------------
    FailureMode(
        "E7",
        "Speculative decoding corrupts the capture",
        "SGLang routes that pass every id check but replay with low agreement from the first "
        "generated token (EAGLE-family drafting with speculative_eagle_topk > 1), or every "
        "generated row all zeros (NGRAM).",
        "With a draft tree wider than one path the capture keeps the rows of the tree nodes in "
        "verification order, and the committed slots read other nodes' routes; NGRAM's verify "
        "pass does not write the capture at all (sgl-project/sglang PR #37949, open; no "
        "released wheel checks it).",
        "rr_vllm reads the server's configuration (/get_server_info, ServerArgs, or what the "
        "user passes) and raises CaptureError on NGRAM and on EAGLE-family drafting with "
        "topk > 1 on the releases that have the fault; the speculative mode is stored in "
        "every record's provenance. Capture with topk 1 or speculative decoding off.",
    ),
    FailureMode(
        "E8",
        "Hierarchical cache restores stale prefix rows",
        "After a prefix is restored from SGLang's host-memory tier, its rows hold routes of "
        "another sequence while its tokens are identical (sglang #26975).",
        "The hierarchical cache moves KV blocks between device and host but not the capture "
        "rows keyed by them, so a restored prefix reads whatever the rows hold.",
        "rr_vllm raises CaptureError when R3 capture meets enable_hierarchical_cache; capture "
        "with the hierarchical cache off (the device radix cache alone is fine).",
    ),
    FailureMode(
        "E9",
        "Unchunked prefill overflows the capture buffer",
        "Long prompts come back with garbage or out-of-range rows, or the server fails on a "
        "long prefill, only with chunked prefill off (sglang #26860).",
        "SGLang sizes the capture buffer from chunked_prefill_size (and max_running_requests); "
        "with chunked prefill disabled (-1) a prefill batch can be longer than the buffer.",
        "rr_vllm raises CaptureError when chunked_prefill_size is -1 or 0 with capture on; keep "
        "chunked prefill on (any positive size).",
    ),
)
