"""The VLA policy in LeRobot's layout: ``configuration_vla`` (``VLAConfig``, registered on LeRobot's policy
registry as ``vla``), ``modeling_vla`` (``VLAPolicy``), ``processor_vla`` (LeRobot's processor pipelines)."""

from vla.policy.configuration_vla import VLAConfig
from vla.policy.decode_info import DecodeInfo, DecodeStats
from vla.policy.modeling_vla import VLAPolicy
from vla.policy.processor_vla import make_vla_pre_post_processors

__all__ = ["DecodeInfo", "DecodeStats", "VLAConfig", "VLAPolicy", "make_vla_pre_post_processors"]
