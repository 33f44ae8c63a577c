"""rr_fakes: test doubles and a CPU harness for routing replay; the path says what each part is.

- ``rr_fakes.shims``: a real library run here under shims (megatron-core, verl, transformers'
  models and checkpoints, vLLM's CPU build, verl's own job, Ray's temp dir);
- ``rr_fakes.emulations``: emulations, built from the real project's source, of what cannot run
  here (rollout engines' answers, MindSpeed, torch_npu);
- ``rr_fakes.hf_to_megatron``: Hugging Face checkpoints as real megatron-core models (public API);
- the underscored modules here (``_builders``, ``_models``, ``_routers``, ``_tiny_moe``,
  ``_random_routes``, ``_rollout``): our own torch-only doubles, their names exported here;
- harness plumbing: ``pins`` (the pinned releases, read by path), ``pytest_support`` (the leak
  check plugin), ``sweeps``, ``adapter_protocol``.

Only tests, benchmarks and the demo import it. Names load on first use.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
