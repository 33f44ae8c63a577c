"""Version ranges this package supports, as plain data: docs, `rr doctor` and the nox matrix
read them from here."""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"vllm": ">=0.14,<0.34"}
