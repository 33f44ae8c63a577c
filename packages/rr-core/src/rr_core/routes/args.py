"""Argument checks live in :mod:`rr_core.checks`; the route modules import them from here."""

from rr_core.checks import as_index

__all__ = ["as_index"]
