from __future__ import annotations

from rr_fakes.pytest_support import _no_leaked_attachments

__all__ = ["_no_leaked_attachments"]  # an autouse fixture: importing it here applies it
