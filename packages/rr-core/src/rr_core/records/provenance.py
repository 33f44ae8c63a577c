"""Where a record's routes came from: the engine that routed them and the settings that decide
whether they can be replayed exactly, stored in the record's header (format version 2).

A provenance is a flat JSON object. Its known keys are typed (:data:`PROVENANCE_KEYS`); others
are kept as written, as long as their values are strings, numbers, booleans or null, so that an
adapter can add a setting without a new format version. Version-1 files carry none and read as
an empty provenance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rr_core.errors import RecordFileError

#: The keys rr's adapters write, and the JSON types each may hold (None: unknown, not recorded).
PROVENANCE_KEYS: dict[str, tuple[type, ...]] = {
    "engine": (str,),  # "vllm", "sglang", "trtllm", "megatron" (R2) ...
    "engine_version": (str,),  # the engine's release, as its package metadata says
    "routing_precision": (str,),  # the router's logits / top-k dtype, e.g. "float32"
    "speculative": (str,),  # the speculative mode ("none", "EAGLE topk=1", ...)
    "prefix_caching": (bool,),  # whether cached-prefix rows were served from a cache
    "id_dtype": (str,),  # the dtype the engine sent the ids in ("int32", "uint8", ...)
}
MAX_PROVENANCE_KEYS = 64


def check_provenance(provenance: Any, where: str) -> dict[str, Any]:
    """``provenance`` as a plain dict, or a :class:`RecordFileError` naming ``where``, the key
    and what was expected."""
    if not isinstance(provenance, Mapping):
        raise RecordFileError(
            f"{where}: provenance must be a mapping of setting names to values; got "
            f"{type(provenance).__name__}"
        )
    if len(provenance) > MAX_PROVENANCE_KEYS:
        raise RecordFileError(
            f"{where}: provenance has {len(provenance)} keys; at most {MAX_PROVENANCE_KEYS}"
        )
    out: dict[str, Any] = {}
    for name, value in provenance.items():
        if not isinstance(name, str):
            raise RecordFileError(f"{where}: provenance key {name!r} is not a string")
        if value is None:
            out[name] = None
            continue
        allowed = PROVENANCE_KEYS.get(name, (str, int, float, bool))
        ok = isinstance(value, allowed) and not (bool not in allowed and isinstance(value, bool))
        if not ok:
            expected = " or ".join(t.__name__ for t in allowed)
            raise RecordFileError(
                f"{where}: provenance {name!r} is {value!r} ({type(value).__name__}), expected "
                f"{expected} or None"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise RecordFileError(
                f"{where}: provenance {name!r} is {value!r}; JSON has no NaN or Infinity "
                "(a header holding them is not standard JSON): record a finite number, a "
                "string or None"
            )
        out[name] = value
    return out


def provenance_json(provenance: Mapping[str, Any] | None, where: str) -> str:
    """The header string of a provenance (sorted keys, checked)."""
    return json.dumps(check_provenance(provenance or {}, where), sort_keys=True, allow_nan=False)


def read_provenance(path: Path, text: str) -> dict[str, Any]:
    """A header's provenance string parsed and checked."""
    try:
        value = json.loads(text)
    except ValueError:
        raise RecordFileError(
            f"{path}: metadata provenance is {text!r}, expected a JSON object; the writer of "
            "this file is broken or not rr: rewrite it with rr_core.save_routes"
        ) from None
    return check_provenance(value, f"{path}: metadata")
