"""The failure catalogue: the ways routing replay is known to go wrong, one entry per code.

Error messages cite these codes and point to ``rr explain CODE``, which prints the entry. The
module is plain data (no torch, no rr imports) so that ``rr explain`` answers instantly and on a
machine where torch does not import.

Codes by letter: A addressing the wrong routers, B backward / recompute / lifecycle, C trainer-side
semantics, D aligning routes to tokens, E capture-side failures, F memory and speed.
"""

from __future__ import annotations

import textwrap
from typing import NamedTuple


class FailureMode(NamedTuple):
    """One catalogue entry: what a user sees, why it happens, and what rr does about it."""

    code: str
    title: str
    symptom: str
    cause: str
    handling: str


GROUPS: dict[str, str] = {
    "A": "Addressing the wrong routers",
    "B": "Backward, recompute and lifecycle",
    "C": "Trainer-side semantics",
    "D": "Aligning routes to tokens",
    "E": "Capture-side failures",
    "F": "Memory and speed",
    "G": "Seen in the field since 2026-08",
}

_ENTRIES = (
    # -- A ---------------------------------------------------------------------------------
    FailureMode(
        "A1",
        "Orphan routers from a model built twice",
        "Replay is switched on and the run trains, but the routers that run route natively, with "
        "no error.",
        "Some model builders construct the decoder twice and keep only the second copy. A "
        "process-wide list of routers then holds the discarded copy's routers first, and "
        "addressing routers by their position in that list arms the dead ones.",
        "rr never uses a global router list: it walks the model that is actually forwarded and "
        "numbers its routers by layer. find_orphans() reports routers that are not reachable from "
        "the forwarded model; two routers claiming one layer raise WalkError.",
    ),
    FailureMode(
        "A2",
        "Dense-first layers and the two layer axes",
        "Every MoE layer replays the routes of a neighbouring layer; ids look valid, so nothing "
        "fails, but replay agreement is low.",
        "Engines report one slot per decoder layer (dense layers empty); the trainer has routers "
        "only on MoE layers. Reading an all-layers tensor as if it held MoE layers only (or the "
        "reverse) shifts every slot when the first layers are dense.",
        "Every route tensor carries its layer axis and global layer numbers (RouteMeta). "
        "Conversions between the axes check the axis length against the layer layout and raise "
        "LayoutError on a mismatch; arm() maps slots to routers by layer number, never by "
        "position.",
    ),
    FailureMode(
        "A3",
        "Pipeline and virtual-pipeline offsets",
        "Under pipeline or virtual-pipeline parallelism some stages replay another stage's "
        "layers, or gathered records come back in the wrong layer order.",
        "A stage's slice of the MoE-layer axis starts at the number of MoE layers before it, not "
        "at its decoder-layer offset; the two differ as soon as dense and MoE layers mix. "
        "Gathering across ranks in rank order instead of layer order scrambles VPP chunks.",
        "rr_core.layout computes offsets and MoE ordinals per (pp_rank, vp_stage) in one place, "
        "checked against Megatron's own functions; records are merged by global layer number, "
        "and records that do not match the rank's layers are refused.",
    ),
    FailureMode(
        "A4",
        "MTP layers numbered from 1 again",
        "A multi-token-prediction router picks up decoder layer 1's routes, or a layer-count "
        "check fails.",
        "MTP blocks number their layers from 1, so their routers collide with the first decoder "
        "layers when routers are keyed by layer number.",
        "The model walk starts from the decoder, so MTP routers are never on the decoder's layer "
        "axis and are never armed; two routers claiming one layer number raise WalkError.",
    ),
    FailureMode(
        "A5",
        "Layers routed without a router",
        "Replay shifts by some layers: layer n replays layer n+h's routes.",
        "Some models route their first MoE layers by a hash of the token, with no learned "
        "router; a scheme that numbers routers by the order in which hooks fire does not see "
        "those layers.",
        "rr addresses routers by global layer number from the walk, not by firing order, so "
        "layers without a router simply take no targets.",
    ),
    FailureMode(
        "A6",
        "Walk order and stages without MoE layers",
        "Routers are numbered in module order (hybrid models register blocks out of layer "
        "order), or a collective gather hangs because one pipeline rank has no MoE layer.",
        "Module registration order is not layer order; a rank with zero MoE layers that skips a "
        "collective leaves the others waiting.",
        "The walk sorts routers by layer number. A model without MoE layers attaches with zero "
        "routers and still takes part in arming and in every gather.",
    ),
    # -- B ---------------------------------------------------------------------------------
    FailureMode(
        "B1",
        "FIFO targets under pipeline schedules",
        "Backward recompute replays another micro-batch's routes under interleaved schedules; "
        "frameworks refuse virtual pipelines because of it.",
        "A first-in-first-out list of backward targets assumes backwards run in forward order, "
        "which interleaved (VPP) schedules do not do.",
        "Targets are keyed by micro-batch id. A tracked forward output (or controller."
        "backward(m)) tells a recompute which micro-batch it belongs to, whatever the order; "
        "when that cannot be known, rr raises ReplayError instead of guessing.",
    ),
    FailureMode(
        "B2",
        "Forward-only passes leave targets behind",
        "The next training backward replays an earlier micro-batch's routes; silent when the "
        "token counts match.",
        "A log-prob pass runs forward only, so backward targets it queued are never consumed and "
        "are still there for the next step.",
        "Every target lives until end_step(), which checks that each armed target was used and "
        "clears them all; arming a micro-batch that is still armed raises ReplayError.",
    ),
    FailureMode(
        "B3",
        "Silent fall-through to native routing",
        "Replay is on, yet some layer routes natively and nothing says so.",
        "A router in replay mode that finds no target routes natively instead of failing.",
        "A router in REPLAY with nothing armed raises ReplayError naming the layer and "
        "micro-batch (strict=False turns it into an RRWarning, for debugging only).",
    ),
    FailureMode(
        "B4",
        "Gradients lost for replayed experts",
        "Router weights for replayed experts the native router would not have picked get zero "
        "gradient.",
        "Replay values were gathered from scores that were already top-k masked, so experts "
        "outside the native top-k had zeroed scores.",
        "replay_topk gathers the values from the router's own unmasked scores at the replayed "
        "ids, so the gradient reaches every replayed expert.",
    ),
    FailureMode(
        "B5",
        "State leaking between builds or steps",
        "A new model, or a reference / critic model, replays routes meant for another model or "
        "step.",
        "Global router lists and replay actions are never cleared when a model is rebuilt, or "
        "stay set on models that must not replay.",
        "Router ownership is per controller and per model; attaching a model releases the "
        "previous one, end_step() clears all step state, and a router cannot belong to two "
        "controllers.",
    ),
    # -- C ---------------------------------------------------------------------------------
    FailureMode(
        "C1",
        "Duplicate expert ids in a replayed row",
        "The alltoall dispatcher fails with mismatched split sizes, or a token silently goes to "
        "fewer experts.",
        "A repeated id collapses in the routing map, while the dispatcher assumes exactly "
        "tokens * top_k entries.",
        "Arming refuses rows with repeated ids (ReplayError naming the layer and row); the "
        "Megatron dispatcher fix keeps the dispatcher consistent if one gets through.",
    ),
    FailureMode(
        "C2",
        "Fused router skips the replay hook",
        "Replay is configured but the router output is the native one.",
        "Transformer Engine's fused top-k returns before the point where replay hooks in.",
        "rr_megatron_compat refuses moe_router_fusion=True with replay (ReplayConfigError), and "
        "an installed hook that never fires raises instead of passing silently.",
    ),
    FailureMode(
        "C3",
        "Capacity factor drops tokens after replay",
        "Replay runs, but the trainer drops tokens that the dropless engine kept, so training "
        "does not see the rollout's routing.",
        "Token dropping by a capacity factor is applied after the replayed selection.",
        "check_replay_config warns (ReplayNotEquivalentWarning) or, with capacity='raise', "
        "refuses a capacity factor; set moe_expert_capacity_factor=None for exact replay.",
    ),
    FailureMode(
        "C4",
        "Expert-bias counts over rows that were not replayed",
        "Expert-bias updates or aux-loss statistics drift: padding and native rows are counted "
        "as if they were replayed.",
        "Per-expert token counts are taken over every row, including rows rr left to the native "
        "router.",
        "The controller exposes the replay mask of each router call; rr_megatron_compat can "
        "count only replayed rows (ignore_unreplayed_rows).",
    ),
    FailureMode(
        "C5",
        "Models that must not replay get armed",
        "A reference, critic or teacher model routes with the policy's rollout routes.",
        "Replay is switched on process-wide instead of per model.",
        "Only routers of a model attached to a ReplayController can replay; any other model "
        "always routes natively.",
    ),
    FailureMode(
        "C6",
        "Old Megatron APIs",
        "A replay patch that works on new Megatron breaks on old lines, or one failed import "
        "disables unrelated fixes.",
        "Functions moved between modules and methods across Megatron releases, and a grouped "
        "import fails as a whole when one name is missing.",
        "rr_megatron_compat resolves each hook target per supported line and imports names one "
        "by one; `rr megatron` lists the known issues of the installed line.",
    ),
    FailureMode(
        "C7",
        "A MindSpeed feature replaces routing",
        "Under MindSpeed the router routes natively, or routes every token to experts "
        "arange % E, although replay is on.",
        "MindSpeed's moe_tp_extend_ep (alltoall_seq dispatcher) replaces TopKRouter.routing, and "
        "on its 0.12 line fix_router (registered by --fix-router or --moe-expert-capacity-factor) "
        "replaces topk_softmax_with_capacity; neither calls the function rr hooks.",
        "rr_npu follows what the router reaches (rr's proxies, __wrapped__ chains, MindSpeed's "
        "patch records) and refuses only a MindSpeed replacement it reaches, naming the feature, "
        "the patched function, the trigger and the fix; wrapper-only registrations, entries a "
        "repatch left with patch_func=None and flags no feature reads are accepted. The check "
        "runs again after every MindSpeed apply and at attach.",
    ),
    FailureMode(
        "C8",
        "Megatron imported before MindSpeed's pre-patches",
        "Under MindSpeed the first forward fails inside torch dynamo.",
        "MindSpeed replaces torch.compile with a pass-through before it imports Megatron; "
        "Megatron binds jit_fuser = torch.compile at import, so where Megatron came first every "
        "@jit_fuser function keeps the real compiler.",
        "rr_npu.install() never imports Megatron before it is loaded (the hooks go in at the "
        "first MindSpeed apply or at attach), and attach raises MindSpeedOrderError when "
        "megatron.core.jit.jit_fuser is still the real torch.compile under MindSpeed; import "
        "mindspeed.megatron_adaptor before anything imports megatron.",
    ),
    # -- D ---------------------------------------------------------------------------------
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
    # -- E ---------------------------------------------------------------------------------
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
    # -- F ---------------------------------------------------------------------------------
    FailureMode(
        "F1",
        "Routing dominates the rollout payload",
        "Routes are most of what a rollout sends (hundreds of bytes per token against a few for "
        "token, log-prob and mask).",
        "K ids for every MoE layer of every token, in a wide dtype.",
        "Route batches use the narrowest exact dtype, and the packed and set codecs store each "
        "(token, layer) pair in as few bits as it needs.",
    ),
    FailureMode(
        "F2",
        "Huge route broadcasts and host-memory blowups",
        "Broadcasting routes across pipeline stages times out; hosts run out of memory.",
        "Unsharded routes in wide dtypes, sent to every stage, with JSON / base64 hops.",
        "Each stage selects only its own layers (select_stage); rr_npu broadcasts narrow ids; "
        "records are stored packed and loaded per sample.",
    ),
    FailureMode(
        "F3",
        "Replay overhead varies widely",
        "One framework measures a large step-time cost from replay where another measures "
        "almost none on the same configuration.",
        "Per-layer host work, syncs and copies in the replay path.",
        "Arming checks ids once per micro-batch with a single host sync; with agreement "
        "measurement off, fully replayed batches skip the native top-k entirely.",
    ),
    FailureMode(
        "F4",
        "Host syncs per MoE layer",
        "The GPU pipeline stalls in the dispatcher.",
        "A `.item()` per MoE layer forces a host sync.",
        "The controller's router call has no host sync (agreement is summed on the device; the "
        "syncs of arming happen once per micro-batch). The Megatron alltoall dispatcher fix "
        "costs one sync per replayed layer, and its benchmark measures it.",
    ),
    # -- G ---------------------------------------------------------------------------------
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

#: Every catalogue entry by code, in catalogue order.
FAILURE_MODES: dict[str, FailureMode] = {entry.code: entry for entry in _ENTRIES}


def failure_mode(code: str) -> FailureMode | None:
    """The entry for ``code`` (case and surrounding spaces ignored), or None."""
    return FAILURE_MODES.get(code.strip().upper()) if isinstance(code, str) else None


def render(entry: FailureMode, width: int = 96) -> str:
    """An entry as ``rr explain CODE`` prints it, wrapped to ``width`` columns."""
    head = f"{entry.code}: {entry.title} ({GROUPS[entry.code[0]]})\n\n"
    fields = (
        ("Symptom:", entry.symptom),
        ("Cause:", entry.cause),
        ("What rr does:", entry.handling),
    )
    body = [
        textwrap.fill(
            text,
            width,
            initial_indent=f"{label:<14}",
            subsequent_indent=" " * 14,
            break_on_hyphens=False,
        )
        for label, text in fields
    ]
    return head + "\n".join(body) + "\n"
