"""Emulation of rollout engines' answers (vLLM, SGLang, TRT-LLM), built from their source: every
vLLM routed-experts format (0.14 to 0.33), vLLM's HTTP base64 ``.npy`` form, SGLang's ``meta_info``
and knobs for the capture failures seen in the field. Built from prompt ids, generated ids and
all-layers routes; see ``vllm-facts.md``."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
