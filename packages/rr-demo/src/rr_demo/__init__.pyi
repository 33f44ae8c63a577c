"""The public names of rr_demo, each listed once. ``__init__.py`` loads each name from its module
on first use (lazy_loader)."""

from .chain import (
    run_demo as run_demo,
)
from .config import (
    DemoConfig as DemoConfig,
    TransformersDemoConfig as TransformersDemoConfig,
)
from .report import (
    DemoResult as DemoResult,
)

__version__: str
