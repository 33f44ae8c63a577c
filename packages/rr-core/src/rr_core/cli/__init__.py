"""The ``rr`` command: its shell, ``rr doctor`` and the record-file commands (inspect, convert,
verify). Nothing here imports torch at start-up."""
