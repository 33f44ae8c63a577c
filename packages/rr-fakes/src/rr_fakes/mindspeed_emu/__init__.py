"""An emulated MindSpeed for CPU tests: the patch manager, the per-instance TransformerConfig
rebuild and the routing-replacing features, installable into ``sys.modules`` for one test.

Written from the behaviour documented in ``npu-facts.md``; no MindSpeed code is used.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
