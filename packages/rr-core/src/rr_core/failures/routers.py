"""Catalogue entries of the trainer side: addressing the routers (A), backward / recompute /
lifecycle (B) and the trainer's routing semantics (C)."""

from __future__ import annotations

from rr_core.failures.mode import FailureMode

ENTRIES = (
    # -- A -------------------------------------------------------------------------------------
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
    # -- B -------------------------------------------------------------------------------------
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
    # -- C -------------------------------------------------------------------------------------
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
        "runs again after every MindSpeed apply and at attach. moe_tp_extend_ep's "
        "routing(self, logits) is refused on megatron-core 0.16+ (Megatron passes padding_mask: "
        "TypeError) and on 0.12 unless moe_router_load_balancing_type is aux_loss, whose "
        "selection still reaches rr's hook; MindSpeed's 0.17 / 0.18 lines cannot import it.",
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
        "mindspeed.megatron_adaptor before anything imports megatron. On MindSpeed's 0.17 / 0.18 "
        "lines, which leave the pre-patches to the MegatronAdaptor their mindspeed package "
        "imports first, the order shows in sys.modules: megatron.core ahead of megatron_adaptor.",
    ),
)
