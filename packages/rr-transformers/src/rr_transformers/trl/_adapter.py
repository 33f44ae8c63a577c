"""The installer: rr's hooks in TRL's GRPOTrainer and its colocated vLLM engine.

Patch points (all through the installer's registry, wrapt proxies that keep TRL's signatures):

=========================================================  =====================================
``trl.generation.vllm_generation.LLM`` (the module global)  engine built with route capture
``vllm.LLM.generate``                                      answers decoded (TRL's rollouts only)
``VLLMGeneration.generate``                                the rollout's rows, TP slice applied
``GRPOTrainer.__init__``                                   what rr cannot replay refused by name
``GRPOTrainer._generate_and_score_completions``            routes added to the batch's rows (R2:
                                                           recorded in the rows' first forward)
``GRPOTrainer._compute_loss``                              the training batch's routes in use
``GRPOTrainer._get_per_token_logps_and_entropies``         each chunk armed and replayed
``GRPOTrainer.training_step``                              step ended, agreement logged
=========================================================  =====================================
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

import rr_core.adapters as core
import rr_transformers
from rr_transformers.trl import _binding, _engine, _passes
from rr_transformers.trl._errors import TrlReplayError
from rr_transformers.trl._supported import SUPPORTED

TRL_SPECIFIER = SUPPORTED["trl"]


def installed_trl_version() -> Version | None:
    """TRL's release from its package metadata, or None when it is not installed."""
    try:
        return Version(metadata.version("trl"))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def refusals(config: Any, *, tools: Any, rollout_func: Any, environment_factory: Any) -> None:
    """Raise :class:`TrlReplayError` naming the first GRPOTrainer setting rr cannot replay."""
    if getattr(config, "use_vllm", False) and getattr(config, "vllm_mode", None) != "colocate":
        raise TrlReplayError(
            f"vllm_mode={config.vllm_mode!r}: TRL's vllm-serve answers carry token ids and "
            "log-probs, not the experts each token was routed to; rr replays the colocated "
            "engine (vllm_mode='colocate') or records the trainer's own routes "
            "(use_vllm=False, R2)"
        )
    if rollout_func is not None:
        raise TrlReplayError(
            "GRPOTrainer(rollout_func=...): a custom rollout returns its own completions, whose "
            "routes rr does not see; generate with TRL's engine"
        )
    if tools or environment_factory:
        raise TrlReplayError(
            "GRPOTrainer(tools=... / environment_factory=...): tool calls add turns whose tokens "
            "the engine never routed as one sequence (multi-turn assembly is not built); train "
            "without tools"
        )


def _init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    config = bound.arguments.get("args")
    if config is None:
        raise TrlReplayError(
            "GRPOTrainer without args: rr needs a GRPOConfig (use_vllm=True, "
            "vllm_mode='colocate' for R3, or use_vllm=False for R2)"
        )
    refusals(
        config,
        tools=bound.arguments.get("tools"),
        rollout_func=bound.arguments.get("rollout_func"),
        environment_factory=bound.arguments.get("environment_factory"),
    )
    result = wrapped(*args, **kwargs)
    engine = bool(getattr(config, "use_vllm", False))
    if not engine and getattr(instance, "beta", 0.0) != 0.0 and instance.ref_model is None:
        raise TrlReplayError(
            "use_vllm=False with a PEFT policy and beta != 0: TRL's reference is the policy "
            "with its adapter off, and rr (R2) cannot tell that forward from the policy's own "
            "to record the rollout's routes in it; set beta=0.0 or use_vllm=True"
        )
    _passes.STATES[instance] = _passes.TrainerState(replay=True, engine=engine)
    return result


class TrlInstaller(core.Installer):
    """rr's routing replay in TRL's GRPOTrainer: R3 with a colocated vLLM engine, R2 when TRL
    generates with the trainer's model (``use_vllm=False``)."""

    name = "trl"
    module = "rr_transformers.trl"

    def __init__(self) -> None:
        super().__init__()
        self.owns_router_hooks = False

    def check_dependencies(self, *, force: bool) -> None:
        version = installed_trl_version()
        if version is None:
            raise TrlReplayError("rr_transformers.trl needs trl; it is not installed")
        if not force and version not in SpecifierSet(TRL_SPECIFIER):
            raise TrlReplayError(
                f"trl {version} is outside the tested range {TRL_SPECIFIER}; "
                "install(force=True) hooks it anyway"
            )
        for needed, why in (("vllm", "vLLM's routes"), ("rr_vllm", "them decoded by rr-vllm")):
            if importlib.util.find_spec(needed) is None:
                raise TrlReplayError(
                    f"rr_transformers.trl replays {why}; {needed} is not installed "
                    "(pip install 'rr-transformers[trl]')"
                )

    def _install(self, *, force: bool) -> tuple[str, ...]:
        from vllm import LLM

        generation = importlib.import_module("trl.generation.vllm_generation")
        grpo = importlib.import_module("trl.trainer.grpo_trainer").GRPOTrainer
        hooks: list[tuple[Any, str, Any]] = [
            (generation, "LLM", _engine.build_llm),
            (LLM, "generate", _engine.llm_generate),
            (generation.VLLMGeneration, "generate", _engine.generate_rollout),
            (grpo, "__init__", _init),
            (grpo, "_generate_and_score_completions", _passes.generate_and_score),
            (grpo, "_compute_loss", _passes.compute_loss),
            (grpo, "_get_per_token_logps_and_entropies", _passes.per_token_logps),
            (grpo, "training_step", _passes.training_step),
        ]
        for owner, attribute, wrapper in hooks:
            self.patches.wrap(owner, attribute, wrapper)
        if not rr_transformers.is_installed():
            rr_transformers.install()
            self.owns_router_hooks = True
        return tuple(f"{getattr(o, '__name__', o)}.{a}" for o, a, _ in hooks)

    def _uninstall(self) -> int:
        removed = self.patches.restore()
        _binding.release_all()
        if self.owns_router_hooks:
            self.owns_router_hooks = False
            removed += rr_transformers.uninstall()
        return removed

    def _is_installed(self) -> bool:
        return self.patches.in_place() and rr_transformers.is_installed()


INSTALLER = TrlInstaller()
