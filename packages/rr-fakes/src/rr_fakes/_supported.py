"""Version ranges rr-fakes declares for ``rr doctor`` (entry point ``rr.supported``): none of its
own. Its CPU harness runs the megatron-core lines rr-megatron-compat supports and pins, which
``rr_megatron_compat._supported`` holds."""

from __future__ import annotations

SUPPORTED: dict[str, str] = {}
