"""What the noxfile builds its sessions from: the installer (uv or pip, torch first) and the
per-session stopwatch. Plain Python with no third-party imports, so nox loads it anywhere."""
