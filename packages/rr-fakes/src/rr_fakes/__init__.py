"""rr_fakes: test doubles and a CPU harness for routing replay.

Fake routers and model builders, shims that run real megatron-core on CPU (``rr_fakes.megatron``),
and emulations of the NPU stack (MindSpeed, torch_npu) and of inference engines
(``rr_fakes.engines``). Only tests, benchmarks and the demo import it. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports

if TYPE_CHECKING:
    from rr_fakes._builders import (
        FakeModelConfig as FakeModelConfig,
    )
    from rr_fakes._builders import (
        build_hybrid_model as build_hybrid_model,
    )
    from rr_fakes._builders import (
        build_model as build_model,
    )
    from rr_fakes._builders import (
        build_orphans_then_model as build_orphans_then_model,
    )
    from rr_fakes._builders import (
        build_vpp_chunks as build_vpp_chunks,
    )
    from rr_fakes._builders import (
        moe_pattern as moe_pattern,
    )
    from rr_fakes._builders import (
        routed_layer_numbers as routed_layer_numbers,
    )
    from rr_fakes._builders import (
        vpp_chunk_layer_numbers as vpp_chunk_layer_numbers,
    )
    from rr_fakes._models import (
        FakeDecoder as FakeDecoder,
    )
    from rr_fakes._models import (
        FakeDenseLayer as FakeDenseLayer,
    )
    from rr_fakes._models import (
        FakeExperts as FakeExperts,
    )
    from rr_fakes._models import (
        FakeHashLayer as FakeHashLayer,
    )
    from rr_fakes._models import (
        FakeMixer as FakeMixer,
    )
    from rr_fakes._models import (
        FakeMoELayer as FakeMoELayer,
    )
    from rr_fakes._models import (
        FakeMoEMLP as FakeMoEMLP,
    )
    from rr_fakes._models import (
        FakeMoEModel as FakeMoEModel,
    )
    from rr_fakes._models import (
        run_chunks as run_chunks,
    )
    from rr_fakes._models import (
        stacked_ids as stacked_ids,
    )
    from rr_fakes._rollout import (
        Rollout as Rollout,
    )
    from rr_fakes._rollout import (
        RolloutEmulator as RolloutEmulator,
    )
    from rr_fakes._rollout import (
        record_routes as record_routes,
    )
    from rr_fakes._routers import (
        FakeHashGate as FakeHashGate,
    )
    from rr_fakes._routers import (
        FakeTopKRouter as FakeTopKRouter,
    )
    from rr_fakes._routers import (
        RouterRegistry as RouterRegistry,
    )
    from rr_fakes._routers import (
        ScoreFunction as ScoreFunction,
    )
    from rr_fakes._routers import (
        group_limited_mask_NE as group_limited_mask_NE,
    )
    from rr_fakes._routers import (
        token_hash_NK as token_hash_NK,
    )
    from rr_fakes._tiny_moe import (
        TinyMoEModel as TinyMoEModel,
    )
    from rr_fakes._tiny_moe import (
        TinyRouter as TinyRouter,
    )
    from rr_fakes._tiny_moe import (
        build_tiny_moe as build_tiny_moe,
    )
    from rr_fakes._torch_npu import (
        HCCL_COLLECTIVE_DTYPES as HCCL_COLLECTIVE_DTYPES,
    )
    from rr_fakes._torch_npu import (
        EmulatedTorchNpu as EmulatedTorchNpu,
    )
    from rr_fakes._torch_npu import (
        FakeNpuModule as FakeNpuModule,
    )
    from rr_fakes._torch_npu import (
        GatingCall as GatingCall,
    )
    from rr_fakes._torch_npu import (
        autoload_trap as autoload_trap,
    )
    from rr_fakes._torch_npu import (
        check_hccl_dtype as check_hccl_dtype,
    )
    from rr_fakes._torch_npu import (
        emulated_torch_npu as emulated_torch_npu,
    )
    from rr_fakes._torch_npu import (
        ensure_npu_backend_name as ensure_npu_backend_name,
    )
    from rr_fakes.engines import (
        Faults as Faults,
    )
    from rr_fakes.engines import (
        VllmEra as VllmEra,
    )
    from rr_fakes.engines import (
        sglang_response as sglang_response,
    )
    from rr_fakes.engines import (
        vllm_http_response as vllm_http_response,
    )
    from rr_fakes.engines import (
        vllm_request_output as vllm_request_output,
    )
    from rr_fakes.mindspeed_emu import (
        EmulatedMindSpeed as EmulatedMindSpeed,
    )
    from rr_fakes.mindspeed_emu import (
        PatchManager as PatchManager,
    )
    from rr_fakes.mindspeed_emu import (
        emulated_mindspeed as emulated_mindspeed,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "FakeHashGate": "rr_fakes._routers",
    "FakeTopKRouter": "rr_fakes._routers",
    "RouterRegistry": "rr_fakes._routers",
    "ScoreFunction": "rr_fakes._routers",
    "group_limited_mask_NE": "rr_fakes._routers",
    "token_hash_NK": "rr_fakes._routers",
    "FakeModelConfig": "rr_fakes._builders",
    "build_hybrid_model": "rr_fakes._builders",
    "build_model": "rr_fakes._builders",
    "build_orphans_then_model": "rr_fakes._builders",
    "build_vpp_chunks": "rr_fakes._builders",
    "moe_pattern": "rr_fakes._builders",
    "routed_layer_numbers": "rr_fakes._builders",
    "vpp_chunk_layer_numbers": "rr_fakes._builders",
    "FakeDecoder": "rr_fakes._models",
    "FakeDenseLayer": "rr_fakes._models",
    "FakeExperts": "rr_fakes._models",
    "FakeHashLayer": "rr_fakes._models",
    "FakeMixer": "rr_fakes._models",
    "FakeMoELayer": "rr_fakes._models",
    "FakeMoEMLP": "rr_fakes._models",
    "FakeMoEModel": "rr_fakes._models",
    "run_chunks": "rr_fakes._models",
    "stacked_ids": "rr_fakes._models",
    "EmulatedMindSpeed": "rr_fakes.mindspeed_emu",
    "PatchManager": "rr_fakes.mindspeed_emu",
    "emulated_mindspeed": "rr_fakes.mindspeed_emu",
    "HCCL_COLLECTIVE_DTYPES": "rr_fakes._torch_npu",
    "EmulatedTorchNpu": "rr_fakes._torch_npu",
    "FakeNpuModule": "rr_fakes._torch_npu",
    "GatingCall": "rr_fakes._torch_npu",
    "autoload_trap": "rr_fakes._torch_npu",
    "check_hccl_dtype": "rr_fakes._torch_npu",
    "emulated_torch_npu": "rr_fakes._torch_npu",
    "ensure_npu_backend_name": "rr_fakes._torch_npu",
    "Faults": "rr_fakes.engines",
    "VllmEra": "rr_fakes.engines",
    "sglang_response": "rr_fakes.engines",
    "vllm_http_response": "rr_fakes.engines",
    "vllm_request_output": "rr_fakes.engines",
    "Rollout": "rr_fakes._rollout",
    "RolloutEmulator": "rr_fakes._rollout",
    "record_routes": "rr_fakes._rollout",
    "TinyMoEModel": "rr_fakes._tiny_moe",
    "TinyRouter": "rr_fakes._tiny_moe",
    "build_tiny_moe": "rr_fakes._tiny_moe",
}

__all__ = [
    "HCCL_COLLECTIVE_DTYPES",
    "EmulatedMindSpeed",
    "EmulatedTorchNpu",
    "FakeDecoder",
    "FakeDenseLayer",
    "FakeExperts",
    "FakeHashGate",
    "FakeHashLayer",
    "FakeMixer",
    "FakeMoELayer",
    "FakeMoEMLP",
    "FakeMoEModel",
    "FakeModelConfig",
    "FakeNpuModule",
    "FakeTopKRouter",
    "Faults",
    "GatingCall",
    "PatchManager",
    "Rollout",
    "RolloutEmulator",
    "RouterRegistry",
    "ScoreFunction",
    "TinyMoEModel",
    "TinyRouter",
    "VllmEra",
    "__version__",
    "autoload_trap",
    "build_hybrid_model",
    "build_model",
    "build_orphans_then_model",
    "build_tiny_moe",
    "build_vpp_chunks",
    "check_hccl_dtype",
    "emulated_mindspeed",
    "emulated_torch_npu",
    "ensure_npu_backend_name",
    "group_limited_mask_NE",
    "moe_pattern",
    "record_routes",
    "routed_layer_numbers",
    "run_chunks",
    "sglang_response",
    "stacked_ids",
    "token_hash_NK",
    "vllm_http_response",
    "vllm_request_output",
    "vpp_chunk_layer_numbers",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
