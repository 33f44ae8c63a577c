"""The verl releases whose FSDP engine rr drives, and the names it hooks there."""

from __future__ import annotations

from rr_core.verl_release import VERL_SPECIFIER

#: The tested verl line (``force=True`` at install passes another one): rr's one verl policy.
VERL_FSDP_SPECIFIER = VERL_SPECIFIER

#: verl's FSDP engine module.
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"

#: (class, method) rr wraps: the batch loop (one pass: mode, end of step) and each micro-batch
#: (arm or record around verl's own forward).
HOOKS: tuple[tuple[str, str], ...] = (
    ("FSDPEngine", "forward_backward_batch"),
    ("FSDPEngineWithLMHead", "forward_step"),
)
