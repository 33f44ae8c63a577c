"""What the noxfile builds its sessions from: the installer (uv or pip, torch first) and the
per-session stopwatch; and the import-linter contract type the lint session checks
(``private_imports``). Plain Python with no third-party imports at package level, so nox loads
it anywhere."""
