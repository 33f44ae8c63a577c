"""rr_core: exact MoE routing replay on plain torch tensors.

Torch-dependent names load on first use (PEP 562), so ``import rr_core`` and the ``rr`` command
stay fast and work even where importing torch fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._axis import LAYER_AXES, LayerAxis
from rr_core._errors import (
    AlignmentError,
    CodecError,
    LayoutError,
    RecordFileError,
    ReplayError,
    RouteValidationError,
    RRError,
    RRWarning,
    WalkError,
)
from rr_core._lazy import lazy_exports

if TYPE_CHECKING:
    from rr_core._align import (
        align_routes as align_routes,
    )
    from rr_core._align import (
        pad_rows as pad_rows,
    )
    from rr_core._align import (
        replay_mask_for_lengths as replay_mask_for_lengths,
    )
    from rr_core._align import (
        truncate_routes as truncate_routes,
    )
    from rr_core._atomic import (
        atomic_write as atomic_write,
    )
    from rr_core._codecs import (
        CODECS as CODECS,
    )
    from rr_core._codecs import (
        DEFAULT_CODEC as DEFAULT_CODEC,
    )
    from rr_core._codecs import (
        CodecName as CodecName,
    )
    from rr_core._codecs import (
        EncodedRoutes as EncodedRoutes,
    )
    from rr_core._codecs import (
        bytes_per_token as bytes_per_token,
    )
    from rr_core._codecs import (
        decode_routes as decode_routes,
    )
    from rr_core._codecs import (
        encode_routes as encode_routes,
    )
    from rr_core._codecs import (
        field_bits as field_bits,
    )
    from rr_core._codecs import (
        payload_bytes as payload_bytes,
    )
    from rr_core._controller import (
        DEFAULT_MICROBATCH as DEFAULT_MICROBATCH,
    )
    from rr_core._controller import (
        ReplayController as ReplayController,
    )
    from rr_core._controller import (
        ReplayMode as ReplayMode,
    )
    from rr_core._controller import (
        StepReport as StepReport,
    )
    from rr_core._controller import (
        attached_router_count as attached_router_count,
    )
    from rr_core._controller import (
        controller_of as controller_of,
    )
    from rr_core._controller import (
        router_topk as router_topk,
    )
    from rr_core._layout import (
        LayoutConfig as LayoutConfig,
    )
    from rr_core._layout import (
        dense_layer_numbers as dense_layer_numbers,
    )
    from rr_core._layout import (
        is_moe_layer as is_moe_layer,
    )
    from rr_core._layout import (
        layer_offset as layer_offset,
    )
    from rr_core._layout import (
        moe_layer_numbers as moe_layer_numbers,
    )
    from rr_core._layout import (
        moe_ordinal as moe_ordinal,
    )
    from rr_core._layout import (
        moe_ordinals_of_stage as moe_ordinals_of_stage,
    )
    from rr_core._layout import (
        moe_pattern as moe_pattern,
    )
    from rr_core._layout import (
        num_layers_to_build as num_layers_to_build,
    )
    from rr_core._layout import (
        num_moe_layers as num_moe_layers,
    )
    from rr_core._layout import (
        stage_layer_numbers as stage_layer_numbers,
    )
    from rr_core._layout import (
        stage_moe_layer_numbers as stage_moe_layer_numbers,
    )
    from rr_core._layout import (
        stage_of_layer as stage_of_layer,
    )
    from rr_core._layout import (
        virtual_stage_layer_counts as virtual_stage_layer_counts,
    )
    from rr_core._layout_axis import (
        all_layers_to_moe_layers as all_layers_to_moe_layers,
    )
    from rr_core._layout_axis import (
        axis_length as axis_length,
    )
    from rr_core._layout_axis import (
        moe_layers_to_all_layers as moe_layers_to_all_layers,
    )
    from rr_core._layout_axis import (
        select_stage as select_stage,
    )
    from rr_core._records import (
        RecordHeader as RecordHeader,
    )
    from rr_core._records import (
        load_routes as load_routes,
    )
    from rr_core._records import (
        producer_versions as producer_versions,
    )
    from rr_core._records import (
        read_header as read_header,
    )
    from rr_core._records import (
        read_record as read_record,
    )
    from rr_core._records import (
        save_routes as save_routes,
    )
    from rr_core._routes import (
        PaddingSide as PaddingSide,
    )
    from rr_core._routes import (
        RouteBatch as RouteBatch,
    )
    from rr_core._routes import (
        RouteMeta as RouteMeta,
    )
    from rr_core._routes import (
        narrow_ids as narrow_ids,
    )
    from rr_core._routes import (
        narrowest_dtype as narrowest_dtype,
    )
    from rr_core._shards import (
        RouteIndex as RouteIndex,
    )
    from rr_core._shards import (
        concat_batches as concat_batches,
    )
    from rr_core._shards import (
        load_samples as load_samples,
    )
    from rr_core._shards import (
        shard_path as shard_path,
    )
    from rr_core._shards import (
        take_sequences as take_sequences,
    )
    from rr_core._shards import (
        write_index as write_index,
    )
    from rr_core._shards import (
        write_shard as write_shard,
    )
    from rr_core._topk import (
        TopK as TopK,
    )
    from rr_core._topk import (
        native_topk as native_topk,
    )
    from rr_core._topk import (
        replay_topk as replay_topk,
    )
    from rr_core._topk import (
        same_sets_T as same_sets_T,
    )
    from rr_core._walk import (
        RouterPredicate as RouterPredicate,
    )
    from rr_core._walk import (
        decoder_scope as decoder_scope,
    )
    from rr_core._walk import (
        find_orphans as find_orphans,
    )
    from rr_core._walk import (
        is_router_by_name as is_router_by_name,
    )
    from rr_core._walk import (
        walk_routers as walk_routers,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "CODECS": "rr_core._codecs",
    "DEFAULT_CODEC": "rr_core._codecs",
    "CodecName": "rr_core._codecs",
    "EncodedRoutes": "rr_core._codecs",
    "bytes_per_token": "rr_core._codecs",
    "decode_routes": "rr_core._codecs",
    "encode_routes": "rr_core._codecs",
    "field_bits": "rr_core._codecs",
    "payload_bytes": "rr_core._codecs",
    "RecordHeader": "rr_core._records",
    "load_routes": "rr_core._records",
    "producer_versions": "rr_core._records",
    "read_header": "rr_core._records",
    "read_record": "rr_core._records",
    "save_routes": "rr_core._records",
    "RouteIndex": "rr_core._shards",
    "concat_batches": "rr_core._shards",
    "load_samples": "rr_core._shards",
    "shard_path": "rr_core._shards",
    "take_sequences": "rr_core._shards",
    "write_index": "rr_core._shards",
    "write_shard": "rr_core._shards",
    "atomic_write": "rr_core._atomic",
    "align_routes": "rr_core._align",
    "pad_rows": "rr_core._align",
    "replay_mask_for_lengths": "rr_core._align",
    "truncate_routes": "rr_core._align",
    "DEFAULT_MICROBATCH": "rr_core._controller",
    "ReplayController": "rr_core._controller",
    "ReplayMode": "rr_core._controller",
    "StepReport": "rr_core._controller",
    "attached_router_count": "rr_core._controller",
    "controller_of": "rr_core._controller",
    "router_topk": "rr_core._controller",
    "LayoutConfig": "rr_core._layout",
    "dense_layer_numbers": "rr_core._layout",
    "is_moe_layer": "rr_core._layout",
    "layer_offset": "rr_core._layout",
    "moe_layer_numbers": "rr_core._layout",
    "moe_ordinal": "rr_core._layout",
    "moe_ordinals_of_stage": "rr_core._layout",
    "moe_pattern": "rr_core._layout",
    "num_layers_to_build": "rr_core._layout",
    "num_moe_layers": "rr_core._layout",
    "stage_layer_numbers": "rr_core._layout",
    "stage_moe_layer_numbers": "rr_core._layout",
    "stage_of_layer": "rr_core._layout",
    "virtual_stage_layer_counts": "rr_core._layout",
    "all_layers_to_moe_layers": "rr_core._layout_axis",
    "axis_length": "rr_core._layout_axis",
    "moe_layers_to_all_layers": "rr_core._layout_axis",
    "select_stage": "rr_core._layout_axis",
    "PaddingSide": "rr_core._routes",
    "RouteBatch": "rr_core._routes",
    "RouteMeta": "rr_core._routes",
    "narrow_ids": "rr_core._routes",
    "narrowest_dtype": "rr_core._routes",
    "TopK": "rr_core._topk",
    "native_topk": "rr_core._topk",
    "replay_topk": "rr_core._topk",
    "same_sets_T": "rr_core._topk",
    "RouterPredicate": "rr_core._walk",
    "decoder_scope": "rr_core._walk",
    "find_orphans": "rr_core._walk",
    "is_router_by_name": "rr_core._walk",
    "walk_routers": "rr_core._walk",
}

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "DEFAULT_MICROBATCH",
    "LAYER_AXES",
    "AlignmentError",
    "CodecError",
    "CodecName",
    "EncodedRoutes",
    "LayerAxis",
    "LayoutConfig",
    "LayoutError",
    "PaddingSide",
    "RRError",
    "RRWarning",
    "RecordFileError",
    "RecordHeader",
    "ReplayController",
    "ReplayError",
    "ReplayMode",
    "RouteBatch",
    "RouteIndex",
    "RouteMeta",
    "RouteValidationError",
    "RouterPredicate",
    "StepReport",
    "TopK",
    "WalkError",
    "__version__",
    "align_routes",
    "all_layers_to_moe_layers",
    "atomic_write",
    "attached_router_count",
    "axis_length",
    "bytes_per_token",
    "concat_batches",
    "controller_of",
    "decode_routes",
    "decoder_scope",
    "dense_layer_numbers",
    "encode_routes",
    "field_bits",
    "find_orphans",
    "is_moe_layer",
    "is_router_by_name",
    "layer_offset",
    "load_routes",
    "load_samples",
    "moe_layer_numbers",
    "moe_layers_to_all_layers",
    "moe_ordinal",
    "moe_ordinals_of_stage",
    "moe_pattern",
    "narrow_ids",
    "narrowest_dtype",
    "native_topk",
    "num_layers_to_build",
    "num_moe_layers",
    "pad_rows",
    "payload_bytes",
    "producer_versions",
    "read_header",
    "read_record",
    "replay_mask_for_lengths",
    "replay_topk",
    "router_topk",
    "same_sets_T",
    "save_routes",
    "select_stage",
    "shard_path",
    "stage_layer_numbers",
    "stage_moe_layer_numbers",
    "stage_of_layer",
    "take_sequences",
    "truncate_routes",
    "virtual_stage_layer_counts",
    "walk_routers",
    "write_index",
    "write_shard",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
