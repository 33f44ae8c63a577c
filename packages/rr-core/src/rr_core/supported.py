"""Version ranges rr-core supports, as plain data (``rr doctor`` reads every package's table
through the ``rr.supported`` entry-point group)."""

from __future__ import annotations

SUPPORTED: dict[str, str] = {
    "torch": ">=2.4",
    "numpy": ">=1.26",
}
