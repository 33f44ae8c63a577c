"""Emulation of MindSpeed (it cannot run here), for CPU tests, built from MindSpeed's public source
(its structures; no code copied): the patch registry of ``patch_utils.py``, the adaptor's
pre-patches and patches, the features manager and the command-line arguments of
``args_utils.py``, the config patches of ``arguments_basic.py`` and the MoE features of
``features_manager/moe`` per MindSpeed line (0.12, 0.16, 0.17, 0.18; on 0.17 / 0.18 also the
MegatronAdaptor their ``mindspeed`` package imports), installable into ``sys.modules`` for one
test."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
