"""Multi-process FSDP2 tests (two gloo ranks on the CPU). They spawn processes and take tens of
seconds, so they are collected only when ``RR_DISTRIBUTED=1`` is set (the session that runs them
sets it); the per-line runs of this package leave this folder out."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("RR_DISTRIBUTED") == "1" else ["*.py"]
