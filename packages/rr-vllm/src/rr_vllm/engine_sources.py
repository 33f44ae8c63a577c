"""What an engine-configuration source may be, and how a split deployment's KV role reads.

A source of the wrong type must never read as a configuration in which nothing is known: the
checks it feeds would all pass (an NGRAM server's speculative mode, a decode replica's prompt
rows). JSON text (an HTTP body's ``resp.text``, a CLI flag's value) is parsed; anything else that
is not a mapping or a configuration object is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Set
from typing import Any, Literal

from rr_vllm.errors import CaptureError

Disaggregation = Literal["none", "prefill", "decode", "both"]

#: vLLM's KV roles (``KVTransferConfig.kv_role``) by the side of a split they serve; a
#: ``kv_both`` replica (NixlConnector deployments start both replicas so) serves either side,
#: which each request's transfer parameters decide.
_ROLES: dict[str, Disaggregation] = {"producer": "prefill", "consumer": "decode", "both": "both"}

#: Builtin values that are never a configuration (bytes: decode the body first).
_NOT_A_SOURCE = (bytes, bytearray, memoryview, list, tuple, Set, int, float, complex)


def config_source(source: Any, what: str) -> Any:
    """``source`` as a mapping or configuration object: JSON text parsed to its object, the
    rest (None, bytes, a list, a number) refused naming what came."""
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except ValueError as e:
            raise CaptureError(
                f"{what} is a str that is not JSON ({e}); pass the parsed body (resp.json()), "
                "the engine's arguments object or a mapping of its settings"
            ) from None
        if not isinstance(source, Mapping):
            raise CaptureError(
                f"{what} is JSON text of a {type(source).__name__}, not of an object: not an "
                "engine configuration"
            )
        return source
    if source is None or isinstance(source, _NOT_A_SOURCE):
        hint = " (decode the body: resp.json())" if isinstance(source, bytes | bytearray) else ""
        raise CaptureError(
            f"{what} must be a mapping, the engine's configuration object or JSON text of an "
            f"object; got {type(source).__name__}{hint}: nothing in it says how the engine runs"
        )
    return source


def nested_source(value: Any, what: str) -> Any:
    """A nested setting (``speculative_config``, ``kv_transfer_config``): None when absent, JSON
    text (the CLI's form) parsed, otherwise as :func:`config_source`."""
    return None if value is None else config_source(value, what)


def kv_side(connector: Any, role: Any) -> Disaggregation:
    """The side of a split a vLLM replica serves, from its ``kv_transfer_config``: any spelling
    of a role (``kv_both``, ``KV_BOTH``, ``kv-both``, ``both``) read as vLLM's; a connector
    with no role or an unknown one refused rather than read as "not split"."""
    if connector is None and role is None:
        return "none"
    spelled = str(role).strip().lower().replace("-", "_").removeprefix("kv_")
    side = _ROLES.get(spelled) if isinstance(role, str) else None
    if side is None:
        raise CaptureError(
            f"kv_transfer_config has kv_connector {connector!r} and kv_role {role!r}; vLLM's "
            "roles are kv_producer, kv_consumer and kv_both: the side of the prefill/decode "
            "split this replica serves is unknown (D8); see `rr explain D8`"
        )
    return side


def answered_by_prefill(kv_transfer_params: Any) -> bool:
    """Whether an answer's ``kv_transfer_params`` are a prefill replica's: vLLM's connectors
    (NixlConnector and its kin) return ``do_remote_prefill: true`` from the replica that ran
    the prompt, telling the decode replica to pull its KV cache; the decode replica returns
    none, or ``do_remote_decode: true``."""
    return (
        isinstance(kv_transfer_params, Mapping)
        and kv_transfer_params.get("do_remote_prefill") is True
    )
