"""Every TRL fact of rr_transformers.trl, as plain data with no imports: the TRL releases the
install hooks fit (stated once; ``install()`` refuses others), and the release the ``trl`` test
session pins (the noxfile reads this file by path, so nox imports no torch).

Why one minor line: rr patches private methods of ``GRPOTrainer`` and ``VLLMGeneration``
(``_generate_and_score_completions``, ``_get_per_token_logps_and_entropies``, the colocate
engine's ``generate``), whose names and arguments TRL changes between minor releases.
"""

from __future__ import annotations

SUPPORTED: dict[str, str] = {"trl": ">=1.16,<1.17"}

#: The release the ``trl`` session installs beside vLLM's CPU build.
TESTED_TRL = "1.16.0"
