"""The public names of rr_fakes, each listed once. ``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from ._builders import (
    FakeModelConfig as FakeModelConfig,
    build_hybrid_model as build_hybrid_model,
    build_model as build_model,
    build_orphans_then_model as build_orphans_then_model,
    build_vpp_chunks as build_vpp_chunks,
    moe_pattern as moe_pattern,
    routed_layer_numbers as routed_layer_numbers,
    vpp_chunk_layer_numbers as vpp_chunk_layer_numbers,
)
from ._models import (
    FakeDecoder as FakeDecoder,
    FakeDenseLayer as FakeDenseLayer,
    FakeExperts as FakeExperts,
    FakeHashLayer as FakeHashLayer,
    FakeMixer as FakeMixer,
    FakeMoELayer as FakeMoELayer,
    FakeMoEMLP as FakeMoEMLP,
    FakeMoEModel as FakeMoEModel,
    run_chunks as run_chunks,
    stacked_ids as stacked_ids,
)
from ._random_routes import distinct_ids as distinct_ids
from ._rollout import (
    Rollout as Rollout,
    RolloutEmulator as RolloutEmulator,
    record_routes as record_routes,
)
from ._routers import (
    FakeHashGate as FakeHashGate,
    FakeTopKRouter as FakeTopKRouter,
    RouterRegistry as RouterRegistry,
    ScoreFunction as ScoreFunction,
    group_limited_mask_NE as group_limited_mask_NE,
    token_hash_NK as token_hash_NK,
)
from ._tiny_moe import (
    TinyMoEModel as TinyMoEModel,
    TinyRouter as TinyRouter,
    build_tiny_moe as build_tiny_moe,
)
from .emulations.torch_npu import (
    HCCL_COLLECTIVE_DTYPES as HCCL_COLLECTIVE_DTYPES,
    EmulatedTorchNpu as EmulatedTorchNpu,
    FakeNpuModule as FakeNpuModule,
    GatingCall as GatingCall,
    autoload_trap as autoload_trap,
    check_hccl_dtype as check_hccl_dtype,
    emulated_torch_npu as emulated_torch_npu,
    ensure_npu_backend_name as ensure_npu_backend_name,
)
from .emulations.engines import (
    Faults as Faults,
    VllmEra as VllmEra,
    sglang_response as sglang_response,
    vllm_http_response as vllm_http_response,
    vllm_request_output as vllm_request_output,
)
from .emulations.mindspeed import (
    EmulatedMindSpeed as EmulatedMindSpeed,
    PatchManager as PatchManager,
    emulated_mindspeed as emulated_mindspeed,
)

__version__: str
