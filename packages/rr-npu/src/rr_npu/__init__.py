"""rr_npu: Routing replay on Ascend NPUs with MindSpeed.

The Ascend backend on top of rr_megatron_compat: device abstraction (explicit opt-in, torch_npu
imported only when asked), MindSpeed-aware install in every patch order, the HCCL payload
policy, NPU determinism settings and a guard against fused gating that cannot replay.
Names load on first use: ``import rr_npu`` imports neither torch nor torch_npu.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rr_core._lazy import lazy_exports
from rr_npu._supported import SUPPORTED as SUPPORTED

if TYPE_CHECKING:
    from rr_npu._collectives import HCCL_COLLECTIVE_DTYPES as HCCL_COLLECTIVE_DTYPES
    from rr_npu._collectives import PayloadPolicyError as PayloadPolicyError
    from rr_npu._collectives import WirePlan as WirePlan
    from rr_npu._collectives import all_gather_routes as all_gather_routes
    from rr_npu._collectives import ids_for_gather as ids_for_gather
    from rr_npu._collectives import wire_plan as wire_plan
    from rr_npu._config import config_from_plain as config_from_plain
    from rr_npu._config import config_to_plain as config_to_plain
    from rr_npu._config import declared_class as declared_class
    from rr_npu._config import enable_replay as enable_replay
    from rr_npu._config import replace_config as replace_config
    from rr_npu._determinism import NPU_DETERMINISM_ENV as NPU_DETERMINISM_ENV
    from rr_npu._determinism import DeterminismReport as DeterminismReport
    from rr_npu._determinism import set_npu_determinism as set_npu_determinism
    from rr_npu._device import DeviceChoice as DeviceChoice
    from rr_npu._device import NpuUnavailableError as NpuUnavailableError
    from rr_npu._device import collective_backend as collective_backend
    from rr_npu._device import device_choice as device_choice
    from rr_npu._device import device_type as device_type
    from rr_npu._device import import_torch_npu as import_torch_npu
    from rr_npu._device import visible_devices_var as visible_devices_var
    from rr_npu._gating import FusedGatingError as FusedGatingError
    from rr_npu._gating import GatingGuard as GatingGuard
    from rr_npu._gating import gating_guard_installed as gating_guard_installed
    from rr_npu._gating import install_gating_guard as install_gating_guard
    from rr_npu._gating import replay_active as replay_active
    from rr_npu._gating import uninstall_gating_guard as uninstall_gating_guard
    from rr_npu._gating import unwatch as unwatch
    from rr_npu._gating import watch as watch
    from rr_npu._install import ReinstallAfterApply as ReinstallAfterApply
    from rr_npu._install import attach as attach
    from rr_npu._install import detach as detach
    from rr_npu._install import ensure_installed as ensure_installed
    from rr_npu._install import install as install
    from rr_npu._install import is_installed as is_installed
    from rr_npu._install import uninstall as uninstall
    from rr_npu._mindspeed import ConfigSignatureError as ConfigSignatureError
    from rr_npu._mindspeed import RoutingReplacedError as RoutingReplacedError
    from rr_npu._mindspeed import check_config_signatures as check_config_signatures
    from rr_npu._mindspeed import check_routing_not_replaced as check_routing_not_replaced
    from rr_npu._mindspeed import routing_replacements as routing_replacements

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "HCCL_COLLECTIVE_DTYPES": "rr_npu._collectives",
    "PayloadPolicyError": "rr_npu._collectives",
    "WirePlan": "rr_npu._collectives",
    "all_gather_routes": "rr_npu._collectives",
    "ids_for_gather": "rr_npu._collectives",
    "wire_plan": "rr_npu._collectives",
    "config_from_plain": "rr_npu._config",
    "config_to_plain": "rr_npu._config",
    "declared_class": "rr_npu._config",
    "enable_replay": "rr_npu._config",
    "replace_config": "rr_npu._config",
    "NPU_DETERMINISM_ENV": "rr_npu._determinism",
    "DeterminismReport": "rr_npu._determinism",
    "set_npu_determinism": "rr_npu._determinism",
    "DeviceChoice": "rr_npu._device",
    "NpuUnavailableError": "rr_npu._device",
    "collective_backend": "rr_npu._device",
    "device_choice": "rr_npu._device",
    "device_type": "rr_npu._device",
    "import_torch_npu": "rr_npu._device",
    "visible_devices_var": "rr_npu._device",
    "FusedGatingError": "rr_npu._gating",
    "GatingGuard": "rr_npu._gating",
    "gating_guard_installed": "rr_npu._gating",
    "install_gating_guard": "rr_npu._gating",
    "replay_active": "rr_npu._gating",
    "uninstall_gating_guard": "rr_npu._gating",
    "unwatch": "rr_npu._gating",
    "watch": "rr_npu._gating",
    "ReinstallAfterApply": "rr_npu._install",
    "attach": "rr_npu._install",
    "detach": "rr_npu._install",
    "ensure_installed": "rr_npu._install",
    "install": "rr_npu._install",
    "is_installed": "rr_npu._install",
    "uninstall": "rr_npu._install",
    "ConfigSignatureError": "rr_npu._mindspeed",
    "RoutingReplacedError": "rr_npu._mindspeed",
    "check_config_signatures": "rr_npu._mindspeed",
    "check_routing_not_replaced": "rr_npu._mindspeed",
    "routing_replacements": "rr_npu._mindspeed",
}

__all__ = sorted([*_LAZY, "SUPPORTED", "__version__"])

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
