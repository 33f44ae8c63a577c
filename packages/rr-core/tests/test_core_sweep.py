"""Property sweep over rr_core's data-facing entry points: every call on generated input, valid
or not, returns a result that passes the entry point's own invariant or raises an RRError
subclass, never a bare IndexError/RuntimeError/KeyError/TypeError from inside, never a silently
wrong answer.

The sweeps are test_core_sweep_routes.py, _codecs.py, _layout.py and _replay.py; their generated
input (``JUNK``, ``ANYTHING``, ``tensors``, ``metas``, ``valid_batches``) is in rr_core_testing.
This module checks that every public name of rr_core is swept there or named here.

Entry points covered:

- routes: ``narrowest_dtype``, ``holds_ids``, ``narrow_ids``, ``RouteMeta``,
  ``RouteBatch`` (``__init__``, ``from_sequences``, ``from_padded``, ``validate``,
  ``to_padded``, ``sequence``), ``expected_route_rows``, ``check_route_rows``
- codecs: ``encode_routes``, ``decode_routes``, ``decode_routes_into``, ``bytes_per_token``,
  ``payload_bytes``
- R3 alignment: ``align_routes``, ``truncate_routes``, ``pad_rows``, ``replay_mask_for_lengths``
- layout: ``LayoutConfig``, ``moe_layer_numbers``, ``is_moe_layer``, ``moe_ordinal``,
  ``stage_layer_numbers``, ``layer_offset``, ``num_layers_to_build``, ``stage_of_layer``,
  ``all_layers_to_moe_layers``, ``moe_layers_to_all_layers``, ``select_stage``
- replay: ``native_topk``, ``replay_topk``, ``ReplayController`` (constructor, ``set_mode``,
  ``arm``, ``arm_batch``, ``recorded``), a replayed forward of armed routes
- ``failure_mode``
"""

from __future__ import annotations

import rr_core
from rr_fakes.sweeps import public_api_tests

#: The entry points the test_core_sweep_* modules drive with generated routes and layouts,
#: checking their invariant.
SWEPT_WITH_INVARIANTS = (
    "LayoutConfig", "ReplayController", "ReplayMode", "RouteBatch", "RouteMeta", "align_routes",
    "all_layers_to_moe_layers", "bytes_per_token", "check_route_rows", "decode_routes",
    "decode_routes_into", "encode_routes", "expected_route_rows", "failure_mode", "holds_ids",
    "is_moe_layer", "layer_offset", "moe_layer_numbers", "moe_layers_to_all_layers",
    "moe_ordinal", "narrow_ids", "narrowest_dtype", "native_topk", "num_layers_to_build",
    "pad_rows", "payload_bytes", "replay_mask_for_lengths", "replay_topk", "select_stage",
    "stage_layer_numbers", "stage_of_layer", "truncate_routes",
)  # fmt: skip
#: Entry points whose invariant on arguments of any kind is "a result or an rr error" (paths
#: among them: each example runs in a fresh empty directory).
SWEPT_WITH_JUNK = (
    "RouteIndex", "atomic_write", "controller_of", "decoder_scope", "find_orphans",
    "load_routes", "load_samples", "moe_ordinals_of_stage", "moe_pattern", "num_moe_layers",
    "read_header", "router_topk", "save_routes", "stage_moe_layer_numbers", "take_sequences",
    "walk_routers", "write_index", "write_shard",
)  # fmt: skip
#: Public names that take no outside data.
NOT_ENTRY_POINTS = {
    **dict.fromkeys(
        ("Attachment", "StepReport", "TopK", "RecordHeader", "FailureMode"),
        "a record rr builds and returns",
    ),
    "EncodedRoutes": "what encode_routes builds; decode_routes checks every field (a codec sweep)",
    "Adapter": "the adapter base class: tests/test_adapter_protocol.py drives every adapter",
    **dict.fromkeys(("CodecName", "LayerAxis", "PaddingSide", "RouterPredicate"), "a type alias"),
    **dict.fromkeys(("CODECS", "FAILURE_MODES"), "a constant"),
    **dict.fromkeys(
        (
            "AlignmentError",
            "CodecError",
            "LayoutError",
            "RRError",
            "RRWarning",
            "RecordFileError",
            "ReplayError",
            "RouteValidationError",
            "WalkError",
        ),
        "an error or warning class",
    ),
}


test_entry_point_refuses_junk, test_every_public_name_is_swept_or_named = public_api_tests(
    rr_core,
    swept_above=SWEPT_WITH_INVARIANTS,
    swept_with_junk=SWEPT_WITH_JUNK,
    not_swept=NOT_ENTRY_POINTS,
)
