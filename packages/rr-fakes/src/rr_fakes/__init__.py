"""rr_fakes: Test doubles and a CPU harness for routing replay.

Fake routers and model builders, shims that run real megatron-core on CPU, and emulations of
the NPU stack and of inference engines. Only tests, benchmarks and the demo import it.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
