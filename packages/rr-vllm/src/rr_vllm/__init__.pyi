"""The public names of rr_vllm, each listed once. ``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from .assemble import (
    TrainerLayout as TrainerLayout,
    assemble_resumed as assemble_resumed,
    flatten_completions as flatten_completions,
    to_trainer_layout as to_trainer_layout,
    truncate_response as truncate_response,
    truncate_sample as truncate_sample,
)
from .capture import (
    ModelGeometry as ModelGeometry,
    max_new_tokens as max_new_tokens,
    moe_layer_numbers as moe_layer_numbers,
    route_meta_of as route_meta_of,
)
from .decoded import (
    DecodedRoutes as DecodedRoutes,
    decode_routes_array as decode_routes_array,
)
from .engine_config import (
    EngineConfig as EngineConfig,
    check_engine_config as check_engine_config,
    sglang_engine_config as sglang_engine_config,
    vllm_engine_config as vllm_engine_config,
)
from .errors import (
    CaptureError as CaptureError,
    DecodeOptionsError as DecodeOptionsError,
    EngineOutputError as EngineOutputError,
    RouteStoreEvictedError as RouteStoreEvictedError,
)
from .options import (
    AbortPolicy as AbortPolicy,
    DecodeKeywords as DecodeKeywords,
    DecodeOptions as DecodeOptions,
)
from .prompt_start import (
    drop_rows_before as drop_rows_before,
    prompt_start_to_send as prompt_start_to_send,
)
from .r3v1.decode import (
    R3v1Header as R3v1Header,
    decode_r3v1 as decode_r3v1,
    read_r3v1_header as read_r3v1_header,
)
from .releases import (
    SglangFlags as SglangFlags,
    VllmFlags as VllmFlags,
    installed_vllm_version as installed_vllm_version,
    sglang_flags as sglang_flags,
    vllm_flags as vllm_flags,
)
from .samples import (
    SampleRoutes as SampleRoutes,
)
from .sglang.capture import (
    sglang_request_fields as sglang_request_fields,
)
from .sglang.stream import (
    decode_sglang_stream as decode_sglang_stream,
)
from .sglang.wire import (
    decode_sglang as decode_sglang,
    decode_sglang_openai as decode_sglang_openai,
    sglang_base64_to_array as sglang_base64_to_array,
)
from .split import (
    merge_split_routes as merge_split_routes,
)
from .trtllm.decode import (
    decode_trtllm_output as decode_trtllm_output,
    decode_trtllm_routes as decode_trtllm_routes,
)
from .turns import (
    Trajectory as Trajectory,
    assemble_multi_turn as assemble_multi_turn,
    omission_start as omission_start,
)
from .validate import (
    validate_samples as validate_samples,
)
from .verl.routes import (
    VerlRoutes as VerlRoutes,
    check_verl_replayable as check_verl_replayable,
    concat_verl_routes as concat_verl_routes,
    pack_batch_for_verl as pack_batch_for_verl,
    pack_for_verl as pack_for_verl,
    to_verl_nested as to_verl_nested,
    to_verl_padded as to_verl_padded,
    unreplayable_rows as unreplayable_rows,
)
from .vllm.capture import (
    vllm_engine_args as vllm_engine_args,
    vllm_sampling_fields as vllm_sampling_fields,
)
from .vllm.decode import (
    decode_vllm_batch as decode_vllm_batch,
    decode_vllm_output as decode_vllm_output,
)
from .vllm.store import (
    explain_store_errors as explain_store_errors,
    is_store_eviction as is_store_eviction,
    routes_store_max_bytes as routes_store_max_bytes,
)
from .vllm.stream import (
    decode_vllm_stream as decode_vllm_stream,
)
from .vllm.wire import (
    decode_vllm_http as decode_vllm_http,
    npy_base64_to_array as npy_base64_to_array,
)

__version__: str
