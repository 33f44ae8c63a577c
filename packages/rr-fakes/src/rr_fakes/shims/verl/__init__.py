"""Real verl run under shims on CPU: verl's Megatron engine as a ``MegatronEngineWithLMHead`` over
tiny GPTModels built under verl's router replay patch, the TensorDict its
``forward_backward_batch`` consumes, and a loss in its signature.

Names load on first use (lazy_loader): importing this package imports neither verl, megatron nor
torch, so the release pins (rr_megatron_compat's data) stay cheap to read.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
