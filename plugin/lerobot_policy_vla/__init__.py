"""LeRobot imports this module at the start of its CLIs (it discovers distributions named ``lerobot_policy_*``):
importing ``vla.policy`` registers ``VLAConfig`` as policy type ``vla``, and LeRobot's factory finds ``VLAPolicy``
and ``make_vla_pre_post_processors`` beside it by its naming convention."""

from vla.policy import VLAConfig, VLAPolicy, make_vla_pre_post_processors  # noqa: F401
