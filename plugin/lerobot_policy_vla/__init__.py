"""LeRobot imports this module at the start of its CLIs (it discovers distributions named ``lerobot_policy_*``):
importing ``vla.policy`` registers ``VLAConfig`` as policy type ``vla`` and the policy's normalisation steps
(``vla_normalizer_processor``, ``vla_unnormalizer_processor``) in LeRobot's ``ProcessorStepRegistry``, which
``lerobot-eval`` needs to load a checkpoint's ``policy_preprocessor.json``; LeRobot's factory finds ``VLAPolicy``
and ``make_vla_pre_post_processors`` beside the config by its naming convention."""

from vla.policy import VLAConfig, VLAPolicy, make_vla_pre_post_processors  # noqa: F401
