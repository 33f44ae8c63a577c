"""NPU determinism: the Ascend environment variables beside torch's deterministic mode.

Replay makes routing exact; the rest of the step is only reproducible with deterministic
collectives and matmuls. On Ascend that is ``HCCL_DETERMINISTIC=true`` and
``CLOSE_MATMUL_K_SHIFT=1`` (plus ``LCCL_DETERMINISTIC=1`` for LCCL and
``ATB_MATMUL_SHUFFLE_K_ENABLE=0``), together with
``torch.use_deterministic_algorithms(True, warn_only=True)``. Set them before the process
groups and kernels are created. :func:`set_npu_determinism` reports every change and returns a
handle that restores the previous state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

NPU_DETERMINISM_ENV: dict[str, str] = {
    "HCCL_DETERMINISTIC": "true",
    "CLOSE_MATMUL_K_SHIFT": "1",
    "LCCL_DETERMINISTIC": "1",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
}


@dataclass
class DeterminismReport:
    """What :func:`set_npu_determinism` changed: ``env`` maps each variable it changed to
    ``(before, after)`` (``before`` None = was unset); ``kept`` the ones already right."""

    env: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    kept: tuple[str, ...] = ()
    torch_before: tuple[bool, bool] = (False, False)  # (enabled, warn_only)
    torch_after: tuple[bool, bool] = (True, True)

    @property
    def changed(self) -> bool:
        return bool(self.env) or self.torch_before != self.torch_after

    def describe(self) -> str:
        lines = [f"{k}: {b!r} -> {a!r}" for k, (b, a) in self.env.items()]
        lines += [f"{k}: already {NPU_DETERMINISM_ENV[k]!r}" for k in self.kept]
        lines.append(
            f"torch.use_deterministic_algorithms: {self.torch_before} -> {self.torch_after} "
            "(enabled, warn_only)"
        )
        return "\n".join(lines)

    def restore(self) -> None:
        """Put back what was there before (variables unset again where they were unset)."""
        import torch

        for name, (before, _after) in self.env.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        enabled, warn_only = self.torch_before
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def set_npu_determinism(*, torch_deterministic: bool = True) -> DeterminismReport:
    """Set the NPU determinism variables (and torch's deterministic mode with ``warn_only``);
    returns what changed. Safe on CPU / CUDA hosts: the variables are only read by CANN."""
    import torch

    if not isinstance(torch_deterministic, bool):
        from rr_core import ReplayError

        raise ReplayError(
            "set_npu_determinism(torch_deterministic=...) must be True or False; got "
            f"{torch_deterministic!r} ({type(torch_deterministic).__name__})"
        )
    report = DeterminismReport()
    kept: list[str] = []
    for name, value in NPU_DETERMINISM_ENV.items():
        before = os.environ.get(name)
        if before == value:
            kept.append(name)
            continue
        os.environ[name] = value
        report.env[name] = (before, value)
    report.kept = tuple(kept)
    report.torch_before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if torch_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    report.torch_after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    return report
