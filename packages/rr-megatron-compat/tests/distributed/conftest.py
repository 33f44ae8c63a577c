"""Multi-process replay tests (two gloo ranks under Megatron's real pipeline and expert-parallel
schedules). They spawn processes and take tens of seconds each, so they are collected only when
``RR_DISTRIBUTED=1`` is set (``nox -s distributed`` sets it); the per-line compat runs
leave this folder out."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("RR_DISTRIBUTED") == "1" else ["*.py"]
