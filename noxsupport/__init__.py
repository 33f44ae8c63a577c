"""What the noxfile builds its sessions from: the test pins and what each session installs
(``stacks``), which test files each session runs (``suites``), the installer (uv or pip, torch
first), the per-session stopwatch and the canary's and benchmarks' reports; and the
import-linter contract type the lint session checks (``private_imports``). Plain Python with no
third-party imports at package level (``stacks`` uses packaging, which nox itself needs), so nox
loads it anywhere; nothing here imports torch."""
