"""rr_megatron_compat: exact routing replay inside real megatron-core 0.12 to 0.19.

``install()`` hooks Megatron's router (native ``RouterReplay`` on 0.16+, the router's top-k
step before), ``enable_replay(config)`` sets the replay flag on a config instance, and
``attach(controller, model)`` hands a model's routers to an :class:`rr_core.ReplayController`.
Names load on first use: importing this package (or reading ``SUPPORTED``) imports neither
torch nor megatron.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
