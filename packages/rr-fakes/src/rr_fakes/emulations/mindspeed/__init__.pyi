"""The public names of rr_fakes.emulations.mindspeed, each listed once.
``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from ._config import (
    MLATransformerConfig as MLATransformerConfig,
    TransformerConfig as TransformerConfig,
    make_config_patches as make_config_patches,
)
from ._adaptor import MEGATRON_ADAPTOR as MEGATRON_ADAPTOR
from ._features import (
    LINES as LINES,
    PRE_PATCH_LINES as PRE_PATCH_LINES,
    Feature as Feature,
    FeaturesManager as FeaturesManager,
    Targets as Targets,
    features_for as features_for,
)
from ._install import (
    EmulatedMindSpeed as EmulatedMindSpeed,
    dotted_name as dotted_name,
    emulated_mindspeed as emulated_mindspeed,
    installed_line as installed_line,
)
from ._patches import (
    Patch as Patch,
    PatchManager as PatchManager,
    is_stacking as is_stacking,
    new_patch_manager as new_patch_manager,
)
from ._requirements import (
    dummy_compile as dummy_compile,
)
from ._routing import (
    native_dense_routing as native_dense_routing,
)
