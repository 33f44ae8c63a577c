"""Catalogue entries: Aligning routes to tokens (D)."""

from __future__ import annotations

from rr_core.failures.mode import FailureMode

ENTRIES = (
    # -- D -------------------------------------------------------------------------------------
    FailureMode(
        "D1",
        "The T-1 contract",
        "Route rows and tokens disagree by one (or two), or the last token is replayed with "
        "garbage.",
        "The last sampled token was never the input of a forward, so it has no route; some "
        "backends also omit the last prompt token's route for prefill-only requests.",
        "align_routes accepts T or T-1 rows and marks the rows without a route invalid; "
        "invalid rows go to the native router. Other row counts raise AlignmentError.",
    ),
    FailureMode(
        "D2",
        "Multi-turn and partial-rollout assembly",
        "Routes of later turns attach to the wrong tokens, or tool tokens are replayed as "
        "expert 0.",
        "Turns sliced at the wrong prefix boundary, resumed generations replacing instead of "
        "appending, or tokens that no generation routed filled with zeros.",
        "rr_vllm assembles turns from each turn's own prompt boundary, checks that every turn "
        "starts with the previous one, and leaves tokens without a route invalid (native "
        "routing) instead of zero-filled.",
    ),
    FailureMode(
        "D3",
        "Routes dropped on the way",
        "A request that should carry routes arrives without them, and the trainer routes natively.",
        "A capture flag was not sent, or a field was not copied somewhere between engine and "
        "trainer.",
        "A finished request without routes raises (rr_vllm's missing-routes error) instead of "
        "being passed on as None; aborted requests are the only exception.",
    ),
    FailureMode(
        "D4",
        "Retraction and preemption",
        "Routes describe a re-prefill while the log-probs belong to the first attempt.",
        "A preempted request is prefilled again and its routes overwritten, while the old "
        "log-probs are kept.",
        "rr_vllm refuses routes lost to preemption and keeps rows it cannot trust invalid "
        "rather than mixing two attempts.",
    ),
    FailureMode(
        "D5",
        "Sequence-parallel padding",
        "Rows shift by a few positions after sequence-parallel scatter.",
        "Alignment padding inserted in the middle, or at the start, of the row sequence moves "
        "every row after it.",
        "Padding is only ever appended at the end (sp_pad), padding rows are invalid and route "
        "natively, and scattering rows that are not aligned raises.",
    ),
    FailureMode(
        "D6",
        "Context-parallel layout",
        "Under context parallelism routes attach to the wrong tokens.",
        "The routes were split contiguously while the model splits zigzag (or the reverse).",
        "rr_megatron_compat splits and merges routes with the same layout functions Megatron "
        "uses for its tokens, checked equal to Megatron's own.",
    ),
    FailureMode(
        "D7",
        "Truncation without the routes",
        "Assembly fails with a shape mismatch, or replay uses routes of tokens that were cut.",
        "A response was truncated (stop strings, length limits) but its routes were not.",
        "truncate_routes / truncate_response cut routes together with tokens and never extend; "
        "row counts that do not match raise.",
    ),
    # -- D: split deployments --------------------------------------------------------------
    FailureMode(
        "D8",
        "Prefill/decode split: prompt rows never merged",
        "Replay of a disaggregated rollout disagrees on every prompt token: the decode replica's "
        "prompt rows hold whatever its buffer held, and the prefill replica's rows were dropped "
        "by the router or sidecar (llm-d-router #1473).",
        "The decode replica receives the prompt's KV cache and never runs the prompt's forward "
        "pass, so it has no routes for the prompt; only the prefill replica does.",
        "rr_vllm.merge_split_routes joins the prefill replica's prompt rows with the decode "
        "replica's rows (row counts, prompt length, dtype checked; streamed decode answers "
        "too), and decoders told the answer came from a decode replica refuse its prompt "
        "rows unless they were merged.",
    ),
)
