"""The public names of rr_demo, each listed once. ``__init__.py`` loads each name from its module
on first use (lazy_loader)."""

from .run import (
    DemoConfig as DemoConfig,
    DemoResult as DemoResult,
    TransformersDemoConfig as TransformersDemoConfig,
    run_demo as run_demo,
)

__version__: str
