"""The public names of rr_npu, each listed once. ``__init__.py`` loads each name from its
module on first use (lazy_loader)."""

from ._collectives import (
    HCCL_COLLECTIVE_DTYPES as HCCL_COLLECTIVE_DTYPES,
    PayloadPolicyError as PayloadPolicyError,
    WirePlan as WirePlan,
    all_gather_routes as all_gather_routes,
    ids_for_gather as ids_for_gather,
    wire_plan as wire_plan,
)
from ._config import (
    config_from_plain as config_from_plain,
    config_to_plain as config_to_plain,
    declared_class as declared_class,
    enable_replay as enable_replay,
    replace_config as replace_config,
)
from ._determinism import (
    NPU_DETERMINISM_ENV as NPU_DETERMINISM_ENV,
    DeterminismReport as DeterminismReport,
    set_npu_determinism as set_npu_determinism,
)
from ._device import (
    DeviceChoice as DeviceChoice,
    DeviceChoiceError as DeviceChoiceError,
    NpuUnavailableError as NpuUnavailableError,
    collective_backend as collective_backend,
    device_choice as device_choice,
    device_type as device_type,
    import_torch_npu as import_torch_npu,
    visible_devices_var as visible_devices_var,
)
from ._deprecated import (
    install_gating_guard as install_gating_guard,
    uninstall_gating_guard as uninstall_gating_guard,
)
from ._gating import (
    FusedGatingError as FusedGatingError,
    replay_active as replay_active,
    watch as watch,
)
from ._install import (
    ADAPTER as ADAPTER,
    MindSpeedAdapter as MindSpeedAdapter,
    ReinstallAfterApply as ReinstallAfterApply,
    attach as attach,
    detach as detach,
    ensure_installed as ensure_installed,
    install as install,
    is_installed as is_installed,
    uninstall as uninstall,
)
from ._mindspeed import (
    ConfigSignatureError as ConfigSignatureError,
    check_config_signatures as check_config_signatures,
)
from ._order import (
    MindSpeedOrderError as MindSpeedOrderError,
    check_import_order as check_import_order,
)
from ._routing import (
    Replacement as Replacement,
    RoutingReplacedError as RoutingReplacedError,
    check_routing_not_replaced as check_routing_not_replaced,
    routing_replacements as routing_replacements,
)
from ._supported import (
    SUPPORTED as SUPPORTED,
)

__version__: str
