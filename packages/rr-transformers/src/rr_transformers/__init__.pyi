"""The public names of rr_transformers, each listed once. ``__init__.py`` loads each name from
its module on first use (lazy_loader)."""

from ._attach import (
    Attachment as Attachment,
    attach as attach,
    decoder_layers as decoder_layers,
    detach as detach,
)
from ._errors import (
    PackedForwardError as PackedForwardError,
    RouterHookError as RouterHookError,
    TransformersVersionError as TransformersVersionError,
    UnknownFamilyError as UnknownFamilyError,
)
from ._families import (
    KNOWN_FAMILIES as KNOWN_FAMILIES,
    Family as Family,
)
from ._install import (
    RouterTopkProxy as RouterTopkProxy,
    install as install,
    installed as installed,
    uninstall as uninstall,
)
from ._routes import (
    arm_routes as arm_routes,
    routes_for_packed as routes_for_packed,
    routes_for_padded as routes_for_padded,
)
from ._versions import (
    installed_transformers_version as installed_transformers_version,
)

__version__: str
