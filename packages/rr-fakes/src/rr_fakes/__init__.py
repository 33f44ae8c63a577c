"""rr_fakes: test doubles and a CPU harness for routing replay.

Fake routers and model builders, shims that run real megatron-core on CPU (``rr_fakes.megatron``),
and emulations of the NPU stack (MindSpeed, torch_npu) and of inference engines
(``rr_fakes.engines``). Only tests, benchmarks and the demo import it. Names load on first use.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
