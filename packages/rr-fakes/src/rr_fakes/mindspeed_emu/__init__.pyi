"""The public names of rr_fakes.mindspeed_emu, each listed once.
``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from ._config import (
    MLATransformerConfig as MLATransformerConfig,
    TransformerConfig as TransformerConfig,
    make_config_init_wrapper as make_config_init_wrapper,
)
from ._features import (
    native_dense_routing as native_dense_routing,
)
from ._install import (
    EmulatedMindSpeed as EmulatedMindSpeed,
    dotted_name as dotted_name,
    emulated_mindspeed as emulated_mindspeed,
)
from ._patches import (
    Patch as Patch,
    PatchManager as PatchManager,
    is_stacking as is_stacking,
    resolve_owner as resolve_owner,
)
