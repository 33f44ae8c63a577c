"""Catalogue entries: Seen in the field since 2026-08 (G)."""

from __future__ import annotations

from rr_core.failures.mode import FailureMode

ENTRIES = (
    # -- G -------------------------------------------------------------------------------------
    FailureMode(
        "G1",
        "Expert-bias counts with a padding mask",
        "megatron-core 0.16 to 0.19.2 raise in the expert-bias update when the token count "
        "differs from the expert count, and silently miscount the tokens per expert when the two "
        "are equal (Megatron #6114).",
        "_apply_expert_bias combines the [T, E] routing map with the [T] ~padding_mask without "
        "broadcasting it over the experts.",
        "On the lines where the released code is wrong (MEGATRON_FEATURES flag), "
        "rr_megatron_compat counts the expert-bias tokens in Megatron's place, with the mask "
        "broadcast, replayed and padded rows as Megatron means them.",
    ),
    FailureMode(
        "G2",
        "Inference capture with MTP layers",
        "Routes captured from a model with MTP layers crash when they are stacked, or the MTP "
        "layers never record (Megatron #7404).",
        "MTP routers sit outside the decoder and restart numbering at 1; a capture that expects "
        "one record per router finds a None.",
        "The walk keeps MTP routers off the decoder axis (A4), and recorded() names every attached "
        "layer that did not record instead of stacking a None.",
    ),
    FailureMode(
        "G3",
        "Packed R2 records overwrite each other",
        "With several sequences packed in one micro-batch, the replayed routes of all but one "
        "sequence are wrong.",
        "The record was kept per sequence and each sequence's record overwrote the last.",
        "A router records the whole token stream it sees, once per micro-batch; a second record "
        "of the same layer and micro-batch raises. Tests pack several sequences (THD) and replay "
        "each in place.",
    ),
    FailureMode(
        "G4",
        "routed_experts_prompt_start equal to the prompt length",
        "vLLM 0.22 to 0.29 kill the EngineCore, and every later request returns 500 (vLLM #55750).",
        "Their scheduler asserts prompt_start < P although the documented range is 0..P.",
        "rr_vllm.vllm_sampling_fields sends P - 1 on those releases (the extra row is the real "
        "route of the last prompt token); drop_rows_before removes it.",
    ),
    FailureMode(
        "G5",
        "Streamed answers without routes",
        "A streamed request finishes with no routes, or with routes misaligned to the tokens.",
        "The OpenAI streaming path drops routed experts; /inference/v1/generate sends them on "
        "each choice's final chunk only.",
        "rr_vllm.decode_vllm_stream reads the final-chunk form, checks the row count against the "
        "streamed tokens, and refuses OpenAI streams, finished choices without routes and cut "
        "streams by name.",
    ),
    FailureMode(
        "G6",
        "Multi-turn routes re-sent every turn",
        "Route transfer grows with the square of a trajectory's length.",
        "Each turn re-sends the whole conversation, and the engine returns the prefix's routes "
        "again.",
        "rr_vllm.Trajectory asks each turn only for rows it does not hold (a growing "
        "prompt_start), checks the new rows start where the held ones end, and stitches them; "
        "vLLM's cached-prefix omission is decoded as an explicit opt-in.",
    ),
    FailureMode(
        "G8",
        "Async paths drop routes",
        "The trainer routes natively although replay is on (NeMo-RL #3327, #3837).",
        "Routes are lost on a queue or async path and the trainer falls through to native routing.",
        "A router in REPLAY with nothing armed raises (B3), and a finished sample without routes "
        "is refused when it is decoded (D3).",
    ),
    FailureMode(
        "G9",
        "SGLang wire drift",
        "Routes decode to the wrong shape or not at all after an SGLang upgrade.",
        "The base64 step moved from the tokenizer manager to the detokenizer across 0.5.x, and "
        "the OpenAI-compatible path returns routes under choices[].sgl_ext.",
        "rr_vllm decodes each SGLang form it supports from its release data and refuses the "
        "others by name; tests run against the real sglang classes.",
    ),
    FailureMode(
        "G10",
        "Truncated R3/v1 envelopes",
        "A hosted service's router-replay envelope decodes with rows missing, and only a warning "
        "says so.",
        "The reference decoder logs a truncated matrix and goes on.",
        "rr_vllm.decode_r3v1 raises EngineOutputError on a truncated or oversized matrix, as on "
        "every other header or selector fault.",
    ),
    FailureMode(
        "G11",
        "Replay under non-reentrant checkpointing",
        "torch raises CheckpointError (75 vs 70 tensors) in the backward of a replayed step "
        "under FSDP2 with activation checkpointing.",
        "The forward and the recompute route through different autograd graphs, so they save a "
        "different set of tensors.",
        "Record and replay compute a router's output the same way in the forward and the "
        "recompute (ids off the graph, values gathered), in rr_core for every adapter; "
        "rr_transformers' tests run checkpointing reentrant and not, and FSDP2.",
    ),
    FailureMode(
        "G12",
        "In-place edits of the model output",
        "A recompute cannot tell which micro-batch it belongs to after the trainer edits the "
        "output in place (verl's logits.div_(temperature) on a view).",
        "A hook on the output tensor never fires once an in-place op replaced the view's "
        "autograd node.",
        "track() marks the autograd node that produced the output's storage (the view's base), "
        "which stays in the graph.",
    ),
)
