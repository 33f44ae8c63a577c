"""An SGLang server's ``/server_info`` body, as far as routed-expert capture depends on it: the
resolved ServerArgs fields rr reads (their 0.5.23 defaults, ``chunked_prefill_size`` as the
launcher resolves it on one GPU) and the release. ``namespaced=True`` groups the fields by the
``arg_groups`` namespace that holds them in 0.5.23 (``spec``, ``memory``, ``schedule``,
``disagg``, ``model``), the way a client that dumps ``ServerArgs`` records may see them."""

from __future__ import annotations

from typing import Any

#: Field -> (0.5.23 namespace, default as /server_info reports it).
SERVER_FIELDS: dict[str, tuple[str, Any]] = {
    "speculative_algorithm": ("spec", None),
    "speculative_eagle_topk": ("spec", None),
    "speculative_num_draft_tokens": ("spec", None),
    "enable_hierarchical_cache": ("memory", False),
    "disable_radix_cache": ("memory", False),
    "chunked_prefill_size": ("schedule", 8192),
    "disaggregation_mode": ("disagg", "null"),
    "dtype": ("model", "auto"),
}


def sglang_server_info(
    sglang_version: str = "0.5.23", *, namespaced: bool = False, **settings: Any
) -> dict[str, Any]:
    """The ``/server_info`` JSON body of a server launched with ``settings`` (ServerArgs field
    names) on ``sglang_version``."""
    unknown = sorted(set(settings) - set(SERVER_FIELDS))
    if unknown:
        raise ValueError(f"not an emulated ServerArgs field: {unknown}")
    values = {name: settings.get(name, default) for name, (_, default) in SERVER_FIELDS.items()}
    body: dict[str, Any] = {"version": sglang_version, "model_path": "emulated", "tp_size": 1}
    if not namespaced:
        return body | values
    for name, value in values.items():
        body.setdefault(SERVER_FIELDS[name][0], {})[name] = value
    return body
