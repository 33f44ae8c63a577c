"""The public names of rr_fakes.emulations.engines, each listed once. ``__init__.py`` loads
each name from its module on first use (lazy_loader)."""

from ._eras import (
    VllmEra as VllmEra,
    era_dtype as era_dtype,
    era_of as era_of,
)
from ._faults import (
    NO_FAULTS as NO_FAULTS,
    Faults as Faults,
)
from ._objects import (
    CompletionOutput as CompletionOutput,
    RequestOutput as RequestOutput,
    real_vllm_outputs as real_vllm_outputs,
)
from ._r3v1 import (
    r3v1_payload as r3v1_payload,
    r3v1_raw as r3v1_raw,
    r3v1_wrap as r3v1_wrap,
)
from ._server import (
    SERVER_FIELDS as SERVER_FIELDS,
    sglang_server_info as sglang_server_info,
)
from ._stream import (
    openai_stream as openai_stream,
    vllm_generate_stream as vllm_generate_stream,
)
from ._trtllm import (
    TrtllmCompletionOutput as TrtllmCompletionOutput,
    TrtllmRequestOutput as TrtllmRequestOutput,
    trtllm_request_output as trtllm_request_output,
)
from ._vllm import (
    BlockObjectStoreError as BlockObjectStoreError,
    EngineDeadError as EngineDeadError,
    vllm_request_output as vllm_request_output,
)
from ._wire import (
    decode_npy_base64 as decode_npy_base64,
    decode_sglang_routes as decode_sglang_routes,
    encode_npy_base64 as encode_npy_base64,
    sglang_openai_response as sglang_openai_response,
    sglang_openai_stream as sglang_openai_stream,
    sglang_response as sglang_response,
    vllm_generate_response as vllm_generate_response,
    vllm_http_response as vllm_http_response,
)
