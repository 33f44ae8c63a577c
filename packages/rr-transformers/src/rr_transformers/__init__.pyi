"""The public names of rr_transformers, each listed once. ``__init__.py`` loads each name from
its module on first use (lazy_loader)."""

from ._attach import (
    ADAPTER as ADAPTER,
    Attachment as Attachment,
    TransformersAdapter as TransformersAdapter,
    attach as attach,
    decoder_layers as decoder_layers,
    detach as detach,
    install as install,
    installed as installed,
    is_installed as is_installed,
    uninstall as uninstall,
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
