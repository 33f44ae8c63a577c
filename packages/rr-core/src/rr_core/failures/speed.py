"""Catalogue entries: Memory and speed (F)."""

from __future__ import annotations

from rr_core.failures.mode import FailureMode

ENTRIES = (
    # -- F -------------------------------------------------------------------------------------
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
)
