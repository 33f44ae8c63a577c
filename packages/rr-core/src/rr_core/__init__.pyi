"""The public names of rr_core, each listed once. ``__init__.py`` reads this file and loads each
name from its module on first use (lazy_loader), so ``import rr_core`` imports no torch."""

from .adapters import (
    Adapter as Adapter,
    Attachment as Attachment,
)
from .codecs.encoding import (
    CODECS as CODECS,
    CodecName as CodecName,
    EncodedRoutes as EncodedRoutes,
    bytes_per_token as bytes_per_token,
    decode_routes as decode_routes,
    decode_routes_into as decode_routes_into,
    encode_routes as encode_routes,
    payload_bytes as payload_bytes,
)
from .errors import (
    AlignmentError as AlignmentError,
    CodecError as CodecError,
    LayoutError as LayoutError,
    RecordFileError as RecordFileError,
    ReplayError as ReplayError,
    RouteValidationError as RouteValidationError,
    RRError as RRError,
    RRWarning as RRWarning,
    WalkError as WalkError,
)
from .failures import (
    FAILURE_MODES as FAILURE_MODES,
    FailureMode as FailureMode,
    failure_mode as failure_mode,
)
from .layout.axis import (
    all_layers_to_moe_layers as all_layers_to_moe_layers,
    moe_layers_to_all_layers as moe_layers_to_all_layers,
    select_stage as select_stage,
)
from .layout.pipeline import (
    LayoutConfig as LayoutConfig,
    is_moe_layer as is_moe_layer,
    layer_offset as layer_offset,
    moe_layer_numbers as moe_layer_numbers,
    moe_ordinal as moe_ordinal,
    moe_ordinals_of_stage as moe_ordinals_of_stage,
    moe_pattern as moe_pattern,
    num_layers_to_build as num_layers_to_build,
    num_moe_layers as num_moe_layers,
    stage_layer_numbers as stage_layer_numbers,
    stage_moe_layer_numbers as stage_moe_layer_numbers,
    stage_of_layer as stage_of_layer,
)
from .records.atomic import (
    atomic_write as atomic_write,
)
from .records.file import (
    RecordHeader as RecordHeader,
    load_routes as load_routes,
    read_header as read_header,
    save_routes as save_routes,
)
from .records.shards import (
    RouteIndex as RouteIndex,
    load_samples as load_samples,
    take_sequences as take_sequences,
    write_index as write_index,
    write_shard as write_shard,
)
from .replay.align import (
    align_routes as align_routes,
    pad_rows as pad_rows,
    replay_mask_for_lengths as replay_mask_for_lengths,
    truncate_routes as truncate_routes,
)
from .routes.rows import (
    check_route_rows as check_route_rows,
    expected_route_rows as expected_route_rows,
)
from .replay.controller import (
    ReplayController as ReplayController,
    ReplayMode as ReplayMode,
    StepReport as StepReport,
    controller_of as controller_of,
    router_topk as router_topk,
)
from .replay.topk import (
    TopK as TopK,
    native_topk as native_topk,
    replay_topk as replay_topk,
)
from .replay.walk import (
    RouterPredicate as RouterPredicate,
    decoder_scope as decoder_scope,
    find_orphans as find_orphans,
    walk_routers as walk_routers,
)
from .routes.axis import (
    LayerAxis as LayerAxis,
)
from .routes.batch import (
    PaddingSide as PaddingSide,
    RouteBatch as RouteBatch,
)
from .routes.id_dtypes import (
    holds_ids as holds_ids,
    narrow_ids as narrow_ids,
    narrowest_dtype as narrowest_dtype,
)
from .routes.meta import (
    RouteMeta as RouteMeta,
)

__version__: str
