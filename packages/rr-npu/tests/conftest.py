"""rr-npu tests. The torch-only ones run anywhere; the ones that need a real megatron-core skip
with the reason where none is installed. A test that leaves rr's hooks, the gating guard or a
patch-manager wrapper installed fails (the shared leak check)."""

from __future__ import annotations

from rr_fakes.pytest_support import _no_leaked_attachments

__all__ = ["_no_leaked_attachments"]  # an autouse fixture: importing it here applies it
