"""What an engine was started with, as far as its routes depend on it: read from the engine's
own configuration objects or answers, refused where the capture cannot be right (E7, E8, E9),
and stored with the routes as their provenance.

Sources, read by key or attribute (no engine is imported): SGLang's ``/server_info`` (or the
deprecated ``/get_server_info``) body, a ``ServerArgs`` object, or a mapping of the flags the
user launched with; vLLM's ``EngineArgs`` / ``AsyncEngineArgs``, a ``VllmConfig``, or a mapping
of the engine arguments. A setting absent from the source is unknown (None), never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rr_core.checks import check_choice, check_flag, check_instance
from rr_vllm.engine_sources import Disaggregation, config_source, kv_side, nested_source
from rr_vllm.errors import CaptureError
from rr_vllm.releases import installed_vllm_version, sglang_flags

Engine = Literal["vllm", "sglang"]
_MISSING = object()

#: SGLang's EAGLE-family algorithms: a draft tree of ``speculative_eagle_topk`` branches.
SGLANG_TREE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})


def _lookup(source: Any, name: str) -> Any:
    """``name`` in a mapping or object, or in one of its nested records one level down
    (SGLang 0.5.23 groups its fields in namespaces; vLLM's VllmConfig in sub-configs)."""
    if isinstance(source, Mapping):
        if name in source:
            return source[name]
        nested = list(source.values())
    else:
        value = getattr(source, name, _MISSING)
        if value is not _MISSING:
            return value
        nested = list(getattr(source, "__dict__", {}).values())
    for part in nested:
        if isinstance(part, Mapping):
            if name in part:
                return part[name]
        elif hasattr(part, "__dict__") and not isinstance(part, type):
            value = getattr(part, name, _MISSING)
            if value is not _MISSING:
                return value
    return _MISSING


def _setting(source: Any, *names: str) -> Any:
    for name in names:
        value = _lookup(source, name)
        if value is not _MISSING:
            return value
    return None


def _typed(value: Any, kind: type, what: str) -> Any:
    if value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        return value
    raise CaptureError(f"{what} must be {kind.__name__} or absent; got {value!r}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The settings of one engine deployment that decide whether its routes replay exactly.

    ``speculative``: the algorithm (None: off), with ``speculative_topk`` (SGLang's
    ``speculative_eagle_topk``) and ``speculative_tokens``. ``disaggregation``: ``"decode"`` for
    the decode replica of a prefill/decode split, whose prompt rows are refused unless
    ``prompt_rows_merged`` says a router already replaced them with the prefill replica's (D8);
    ``"both"`` for a replica that serves either side (vLLM's ``kv_both``), whose prompt rows are
    refused likewise unless the answer itself says the prefill replica ran the prompt.
    ``routing_precision``: the model dtype the router's logits are computed in, as configured.
    """

    engine: Engine
    version: str | None = None
    speculative: str | None = None
    speculative_topk: int | None = None
    speculative_tokens: int | None = None
    hierarchical_cache: bool | None = None
    chunked_prefill_size: int | None = None
    prefix_caching: bool | None = None
    disaggregation: Disaggregation = "none"
    prompt_rows_merged: bool = False
    routing_precision: str | None = None

    def __post_init__(self) -> None:
        check_choice(self.engine, "EngineConfig.engine", ("vllm", "sglang"), CaptureError)
        choices = ("none", "prefill", "decode", "both")
        check_choice(self.disaggregation, "EngineConfig.disaggregation", choices, CaptureError)
        for name in ("version", "speculative", "routing_precision"):
            _typed(getattr(self, name), str, f"EngineConfig.{name}")
        for name in ("speculative_topk", "speculative_tokens", "chunked_prefill_size"):
            _typed(getattr(self, name), int, f"EngineConfig.{name}")
        for name in ("hierarchical_cache", "prefix_caching"):
            _typed(getattr(self, name), bool, f"EngineConfig.{name}")
        check_flag(self.prompt_rows_merged, "EngineConfig.prompt_rows_merged", CaptureError)

    @property
    def speculative_mode(self) -> str:
        """The speculative mode in words: ``"none"``, ``"EAGLE topk=4 tokens=8"``."""
        if self.speculative is None:
            return "none"
        extra = [f"topk={self.speculative_topk}"] if self.speculative_topk is not None else []
        extra += [f"tokens={self.speculative_tokens}"] if self.speculative_tokens else []
        return " ".join([self.speculative, *extra])

    def provenance(self, id_dtype: str | None = None) -> dict[str, Any]:
        """The record provenance of routes captured here (``rr_core.save_routes(provenance=)``);
        ``id_dtype``: the dtype the engine sent the ids in."""
        return {
            "engine": self.engine,
            "engine_version": self.version,
            "routing_precision": self.routing_precision,
            "speculative": self.speculative_mode,
            "prefix_caching": self.prefix_caching,
            "id_dtype": id_dtype,
            "disaggregation": self.disaggregation,
            "hierarchical_cache": self.hierarchical_cache,
        }


def _version(source: Any, given: str | None) -> str | None:
    found = _setting(source, "version") if given is None else given
    return found if isinstance(found, str) else None


def sglang_engine_config(
    source: Any, *, sglang_version: str | None = None, prompt_rows_merged: bool = False
) -> EngineConfig:
    """The configuration of an SGLang server: its ``/server_info`` (``/get_server_info``) JSON
    body, its ``ServerArgs``, or a mapping of the launch flags by ServerArgs field name
    (``speculative_algorithm``, ``speculative_eagle_topk``, ``enable_hierarchical_cache``,
    ``chunked_prefill_size``, ``disable_radix_cache``, ``disaggregation_mode``, ``dtype``).
    The release is the body's ``version`` unless ``sglang_version`` is given. Checked by
    :func:`check_engine_config`. JSON text is parsed; a source of another type (None, bytes,
    a list, a number) raises :class:`CaptureError`."""
    source = config_source(source, "sglang_engine_config's source")
    mode = _setting(source, "disaggregation_mode")
    radix_off = _setting(source, "disable_radix_cache")
    algorithm = _setting(source, "speculative_algorithm")
    config = EngineConfig(
        engine="sglang",
        version=_version(source, sglang_version),
        speculative=None if algorithm in (None, "", "NONE") else str(algorithm).upper(),
        speculative_topk=_setting(source, "speculative_eagle_topk"),
        speculative_tokens=_setting(source, "speculative_num_draft_tokens"),
        hierarchical_cache=_setting(source, "enable_hierarchical_cache"),
        chunked_prefill_size=_setting(source, "chunked_prefill_size"),
        prefix_caching=None if radix_off is None else not radix_off,
        disaggregation="none" if mode in (None, "null") else mode,
        prompt_rows_merged=prompt_rows_merged,
        routing_precision=_setting(source, "dtype"),
    )
    check_engine_config(config)
    return config


def _speculative(source: Any) -> tuple[str | None, int | None]:
    spec = nested_source(_setting(source, "speculative_config"), "speculative_config")
    if spec is None:
        return None, None
    method = _setting(spec, "method")
    tokens = _setting(spec, "num_speculative_tokens")
    if method is None and _setting(spec, "model") is not None:
        method = "draft_model"
    return (None if method is None else str(method)), tokens


def vllm_engine_config(
    source: Any, *, vllm_version: str | None = None, prompt_rows_merged: bool = False
) -> EngineConfig:
    """The configuration of a vLLM engine: its ``EngineArgs`` / ``AsyncEngineArgs``, a
    ``VllmConfig``, or a mapping of engine arguments (``speculative_config``,
    ``enable_prefix_caching``, ``kv_transfer_config`` whose ``kv_role`` ``"kv_consumer"`` is
    the decode replica of a split deployment and ``"kv_both"`` a replica of either side,
    ``dtype``); nested settings may be the CLI's JSON text. The release defaults to the
    installed one where vllm is installed. Checked by :func:`check_engine_config`."""
    source = config_source(source, "vllm_engine_config's source")
    if vllm_version is None:
        vllm_version = installed_vllm_version()
    method, tokens = _speculative(source)
    kv = nested_source(_setting(source, "kv_transfer_config"), "kv_transfer_config")
    split = "none" if kv is None else kv_side(_setting(kv, "kv_connector"), _setting(kv, "kv_role"))
    dtype = _setting(source, "dtype")
    config = EngineConfig(
        engine="vllm",
        version=vllm_version,
        speculative=method,
        speculative_tokens=tokens,
        prefix_caching=_setting(source, "enable_prefix_caching"),
        disaggregation=split,
        prompt_rows_merged=prompt_rows_merged,
        routing_precision=None if dtype is None else str(dtype).removeprefix("torch."),
    )
    check_engine_config(config)
    return config


def check_engine_config(config: EngineConfig) -> None:
    """Refuse, by name, the configurations whose routes are wrong on the releases where they
    are (:data:`rr_vllm._supported.SGLANG_FEATURES`): SGLang speculative decoding with a draft
    tree (EAGLE-family, topk > 1) or NGRAM (E7), the hierarchical cache (E8), chunked prefill
    off (E9). vLLM 0.32+ drops the rows of rejected draft tokens (its aux-output connector),
    and no vLLM release is known to corrupt them, so vLLM's speculative mode is recorded, not
    refused."""
    takes = "check_engine_config takes an EngineConfig (vllm_engine_config, sglang_engine_config)"
    config = check_instance(config, EngineConfig, CaptureError, takes)
    if config.engine != "sglang":
        return
    flags = None if config.version is None else sglang_flags(config.version)
    where = f"SGLang {config.version or '(release unknown)'}"
    algorithm = config.speculative
    if algorithm == "NGRAM" and (flags is None or flags.ngram_writes_no_routes):
        raise CaptureError(
            f"{where} with speculative_algorithm NGRAM returns all-zero generated rows (its "
            "verify pass does not write the routed-experts capture, sglang PR #37949); capture "
            "with speculative decoding off (E7); see `rr explain E7`"
        )
    tree = algorithm in SGLANG_TREE_ALGORITHMS and (config.speculative_topk or 1) > 1
    if tree and (flags is None or flags.spec_tree_wrong_rows):
        raise CaptureError(
            f"{where} with speculative_algorithm {algorithm} and speculative_eagle_topk="
            f"{config.speculative_topk} returns the routes of other draft-tree nodes in the "
            "committed slots (sglang PR #37949); use speculative_eagle_topk=1 or speculative "
            "decoding off (E7); see `rr explain E7`"
        )
    if config.hierarchical_cache and (flags is None or flags.hicache_stale_rows):
        raise CaptureError(
            f"{where} with enable_hierarchical_cache: a prefix restored from the host tier "
            "comes back with stale routes while its tokens match (sglang #26975); capture with "
            "the hierarchical cache off (E8); see `rr explain E8`"
        )
    size = config.chunked_prefill_size
    if size is not None and size <= 0 and (flags is None or flags.buffer_sized_by_chunk):
        raise CaptureError(
            f"{where} with chunked_prefill_size={size} (chunked prefill off): the capture "
            "buffer is sized from chunked_prefill_size and a longer prefill overflows it "
            "(sglang #26860); set a positive --chunked-prefill-size (E9); see `rr explain E9`"
        )


def check_split_rows(
    config: EngineConfig | None, what: str, prompt_start: int, p: int, *, prefill: bool = False
) -> None:
    """D8: rows of a decode replica's prompt tokens hold whatever its buffer held. ``prefill``:
    the answer says the prefill replica ran the prompt (:func:`answered_by_prefill`)."""
    if config is None or config.prompt_rows_merged or prompt_start >= p:
        return
    side = config.disaggregation
    if side == "decode" or (side == "both" and not prefill):
        replica = (
            "the decode replica"
            if side == "decode"
            else "a replica that serves either side (kv_role kv_both) whose answer does not "
            "say it ran the prompt (no kv_transfer_params.do_remote_prefill), so the decode "
            "replica"
        )
        raise CaptureError(
            f"{what}: rows {prompt_start}..{p - 1} are the prompt's, returned by {replica} of "
            f"a prefill/decode split ({config.engine}), which never ran the prompt: "
            "they hold whatever its buffer held. Request rows from the prompt length on "
            "(routed_experts_prompt_start / routed_experts_start_len = P) and join them with "
            "the prefill replica's rows (rr_vllm.merge_split_routes), or pass "
            "prompt_rows_merged=True where a router already did (D8); see `rr explain D8`"
        )
