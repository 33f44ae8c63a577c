"""``install()`` needs TRL only: R2 (``use_vllm=False``) installs and trains in a process where
vLLM and rr-vllm cannot be imported, and a trainer that asks for vLLM there is refused naming
what is missing. The engine's hooks arm when a ``use_vllm=True`` trainer is built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rr_transformers.trl
from rr_transformers.trl import TrlReplayError
from rr_transformers.trl import _adapter as adapter

HERE = Path(__file__).parent

#: Run first in the child: vLLM and rr-vllm absent as an uninstalled package is (find_spec
#: answers None, TRL's is_vllm_available() False, an import raises ModuleNotFoundError).
BLOCK = """
import sys
for name in ("vllm", "rr_vllm"):
    sys.modules[name] = None
"""

#: Asserted last in the child: nothing of vLLM or rr-vllm was loaded on the way.
NOTHING_LOADED = """
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "rr_vllm") and "." in m)
assert not loaded, loaded
assert sys.modules["vllm"] is None and sys.modules["rr_vllm"] is None
print("NO_VLLM_OK")
"""


#: What TRL's colocated engine sets in this process's environment (``vllm_generation.py``): a
#: child that inherits them joins this process's rendezvous (its port is taken) instead of
#: running alone.
DISTRIBUTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _child(body: str, timeout: float) -> str:
    script = BLOCK + textwrap.dedent(body) + NOTHING_LOADED
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=HERE, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    told = f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, told
    assert "NO_VLLM_OK" in done.stdout, told
    return done.stdout


def test_install_needs_no_vllm_and_a_vllm_trainer_is_refused_by_name() -> None:
    _child(
        """
        import pytest
        import rr_transformers.trl
        from trl import GRPOConfig, GRPOTrainer
        from rr_transformers.trl import TrlReplayError

        hooked = rr_transformers.trl.install()
        assert rr_transformers.trl.is_installed(), hooked
        assert "GRPOTrainer._get_per_token_logps_and_entropies" in hooked, hooked
        config = GRPOConfig(output_dir="unused", use_vllm=True, vllm_mode="colocate",
                            use_cpu=True, report_to="none")
        with pytest.raises(TrlReplayError, match=r"vllm is not installed .*use_vllm=False"):
            GRPOTrainer(model="unused", reward_funcs=[], args=config)
        assert rr_transformers.trl.INSTALLER.engine_patches.live() == []
        assert rr_transformers.trl.uninstall() > 0
        """,
        timeout=300,
    )


def test_r2_trains_where_vllm_cannot_be_imported() -> None:
    """One GRPO step of TRL's trainer generating with its own model, rr recording and
    replaying every row, with no vLLM in the process."""
    out = _child(
        """
        import grpo_runs

        run = grpo_runs.run(grpo_runs.Engines(), "qwen3_moe", "float32", replay=True,
                            use_vllm=False, steps=1)
        grpo_runs.assert_replayed(run, whole_rows=True)
        print("R2_STEPS", len(run.steps), run.steps[0].pairs, run.steps[0].differ)
        """,
        timeout=600,
    )
    line = next(x for x in out.splitlines() if x.startswith("R2_STEPS"))
    _, steps, pairs, differ = line.split()
    assert (int(steps), int(differ)) == (1, 0), line
    assert int(pairs) > 0, line


def test_a_vllm_trainer_without_rr_vllm_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setitem(sys.modules, "rr_vllm", None)  # as if not installed
    config = GRPOConfig(
        output_dir="unused", use_vllm=True, vllm_mode="colocate", use_cpu=True, report_to="none"
    )
    rr_transformers.trl.install()
    try:
        with pytest.raises(TrlReplayError, match=r"rr_vllm is not installed \(pip install"):
            GRPOTrainer(model="unused", reward_funcs=[], args=config)
        assert adapter.INSTALLER.engine_patches.live() == []  # nothing armed
    finally:
        rr_transformers.trl.uninstall()


def test_a_vllm_trainer_arms_the_engine_hooks_and_uninstall_takes_them_out() -> None:
    from trl.generation import vllm_generation

    original = vllm_generation.__dict__["LLM"]
    hooked = rr_transformers.trl.install()
    try:
        assert not set(hooked) & set(adapter.ENGINE_HOOKS)  # install() alone: the trainer's
        assert adapter.INSTALLER.arm_engine() == adapter.ENGINE_HOOKS
        assert vllm_generation.__dict__["LLM"] is not original
        assert rr_transformers.trl.is_installed()
        assert rr_transformers.trl.install() == hooked  # again: the armed side stays
        assert vllm_generation.__dict__["LLM"] is not original
    finally:
        rr_transformers.trl.uninstall()
    assert vllm_generation.__dict__["LLM"] is original
    assert adapter.INSTALLER.live_patches() == []
