"""rr_core: exact MoE routing replay on plain torch tensors.

Subpackages, in the order a step uses them: ``replay`` (controller, replayed top-k, model walk, R3
alignment), ``routes`` (route batches and their checks), ``layout`` (MoE layers and pipeline
stages), ``codecs`` and ``records`` (compact storage), ``cli`` (the ``rr`` command). The public
names are listed once, in ``__init__.pyi``; each loads from its module on first use, so
``import rr_core`` and the ``rr`` command stay fast and work even where importing torch fails.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
