"""The argument checks rr_megatron_compat's modules use: rr_core's, in one import."""

from rr_core.adapters import check_controller, check_model
from rr_core.checks import as_index, check_choice, check_flag, check_instance, check_tensor

__all__ = [
    "as_index",
    "check_choice",
    "check_controller",
    "check_flag",
    "check_instance",
    "check_model",
    "check_tensor",
]
