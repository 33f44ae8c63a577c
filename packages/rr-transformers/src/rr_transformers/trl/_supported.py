"""Every TRL fact of rr_transformers.trl, as plain data with no imports: the TRL releases the
install hooks fit (stated once; ``install()`` refuses others). The release the ``trl`` test
session installs is the harness's pin (``TESTED_TRL`` in ``rr_fakes/pins.py``).

Why one minor line: rr patches private methods of ``GRPOTrainer`` and ``VLLMGeneration``
(``_generate_and_score_completions``, ``_get_per_token_logps_and_entropies``, the colocate
engine's ``generate``), whose names and arguments TRL changes between minor releases.
"""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"trl": ">=1.16,<1.17"}
