"""rr_demo: the main job of routing replay, end to end on CPU.

Rollouts from a real vLLM engine or an emulated one, routes captured as vLLM returns them,
decoded and validated by ``rr_vllm``, stored with ``rr_core``'s codecs, then a real trainer
without and with R3 replay: megatron-core through ``rr_megatron_compat``, or a transformers MoE
model through ``rr_transformers`` (``TransformersDemoConfig``; that path imports no megatron).
:mod:`rr_demo.chain` reads the main job stage by stage; each engine and trainer is a module of
its own that the chain loads by name. It is the only rr package that imports the adapters
together; nothing imports it. Names load on first use.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
