"""rr_transformers: exact routing replay inside Hugging Face transformers MoE models.

``install()`` routes the top-k step of every known MoE family's router through
``rr_core.router_topk``; ``attach(controller, model)`` gives a controller the routers of a real
``PreTrainedModel`` by decoder layer. The family's own code computes the gate weights from the
replayed experts, so FSDP2, activation checkpointing and packed batches need nothing more.
transformers is imported on first use; reading the supported-version table imports no torch.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
