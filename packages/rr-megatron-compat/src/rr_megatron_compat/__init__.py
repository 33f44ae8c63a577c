"""rr_megatron_compat: Exact routing replay inside real megatron-core 0.12 to 0.19.

Makes replay work inside real megatron-core (0.12 to 0.19) and says clearly when a version is
outside that range.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
