"""LeRobot's processor pipelines for the VLA policy (``make_vla_pre_post_processors``, found by LeRobot's factory by
its naming convention), and the check that a folder's processor files name only these steps. LeRobot's own commands
find the policy through the plugin distribution in ``plugin/``.

    pre:  rename -> batch -> normalizer_processor (LeRobot's, identity) -> device
    post: unnormalizer_processor (LeRobot's, identity) -> cpu

The policy normalises itself, on every path: its pipeline (``vla.policy.pipeline``) runs ``Normalize`` on the raw
observation and ``Unnormalize`` (then ``AbsoluteActions``, adding the raw state back for relative actions) on the
decoded chunk, before ``select_action``'s queue. It cannot be the post-processor's job: a relative chunk becomes
absolute with the state it was predicted from, and LeRobot's post-processor sees one action of the queue at a time,
without that state. So ``lerobot-train``, ``lerobot-eval`` and ``lerobot-rollout`` normalise exactly as ``vla``'s own
commands do, with the same normalisers (exact quantiles of the training frames, ``vla.policy.fitting``).

LeRobot's own normaliser steps are there, mapping every feature type to IDENTITY (``VLAConfig.normalization_mapping``),
only so that ``lerobot-train --policy.path=DIR`` can load the folder: it passes the new dataset's statistics to steps of
those names and refuses a pipeline that has none. With IDENTITY they change nothing, whatever statistics they hold.

Folders saved while normalisation ran in processor steps name ``vla_normalizer_processor`` and
``vla_unnormalizer_processor``; those names stay registered as steps that pass the batch through
(``RetiredNormalizationStep``), so such a folder loads and acts as it did, normalised once, by the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot.configs import NormalizationMode
from lerobot.processor import ProcessorStep, ProcessorStepRegistry

from vla.io import read_json

PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
RETIRED_STEPS = ("vla_normalizer_processor", "vla_unnormalizer_processor")  # saved folders may name them
# The steps make_vla_pre_post_processors writes, and the retired ones. LeRobot's DataProcessorPipeline.from_pretrained
# imports and calls any class a processor file names, so a folder whose files name anything else is refused first.
KNOWN_STEPS = (
    "rename_observations_processor",
    "to_batch_processor",
    "normalizer_processor",
    "device_processor",
    "unnormalizer_processor",
    *RETIRED_STEPS,
)
LEROBOT_NORMALIZERS = ("normalizer_processor", "unnormalizer_processor")  # accepted only as identity (above)
STEP_KEYS = {"registry_name", "config", "state_file"}  # what LeRobot writes for a registered step


@dataclass
class RetiredNormalizationStep(ProcessorStep):
    """A step a saved folder may name from when normalisation ran in processor steps: it passes the transition
    through (the policy normalises), keeping the config and state it was saved with unread."""

    modes: dict[str, str] = field(default_factory=dict)

    def __call__(self, transition: dict) -> dict:
        return transition

    def get_config(self) -> dict[str, Any]:
        return {"modes": dict(self.modes)}

    def load_state_dict(self, state: dict) -> None:
        pass

    def transform_features(self, features):
        return features


@ProcessorStepRegistry.register(name=RETIRED_STEPS[0])
class RetiredNormalizerStep(RetiredNormalizationStep):
    """``vla_normalizer_processor`` in a saved pre-processor."""


@ProcessorStepRegistry.register(name=RETIRED_STEPS[1])
class RetiredUnnormalizerStep(RetiredNormalizationStep):
    """``vla_unnormalizer_processor`` in a saved post-processor."""


def check_processor_files(folder: str | Path) -> None:
    """Refuse processor files that name steps other than this policy's own (code would run on load otherwise): each
    step must be a registered one of ``KNOWN_STEPS``, with no ``class`` to import, and LeRobot's normaliser steps
    must map every feature to IDENTITY (else the batch would be normalised twice)."""
    for name in PROCESSOR_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        steps = read_json(path, "LeRobot processor pipeline").get("steps", [])
        for i, step in enumerate(steps if isinstance(steps, list) else [steps]):
            registry = step.get("registry_name") if isinstance(step, dict) else None
            where = f"{path}: step {i}" + (f" ({registry!r})" if registry else "")
            if isinstance(step, dict) and "class" in step:
                raise ValueError(
                    f"{where} carries a 'class' entry ({step['class']!r}), which a VLA policy never writes: loading "
                    "the folder through LeRobot would import and run that code. Do not load this folder; save the "
                    "policy again with vla"
                )
            if registry not in KNOWN_STEPS:
                raise ValueError(
                    f"{path} names the processor step {step if registry is None else registry!r}, which a VLA policy "
                    f"never writes (its steps: {', '.join(KNOWN_STEPS)}); loading it through LeRobot would import and "
                    "run that code. Do not load this folder; save the policy again with vla"
                )
            extra = sorted(set(step) - STEP_KEYS)
            if extra:
                raise ValueError(
                    f"{where} carries {', '.join(map(repr, extra))}, which a VLA policy never writes "
                    f"(a step holds {', '.join(sorted(STEP_KEYS))}); save the policy again with vla"
                )
            norm_map = (step.get("config") or {}).get("norm_map") if isinstance(step.get("config"), dict) else None
            if registry in LEROBOT_NORMALIZERS and not (
                isinstance(norm_map, dict) and norm_map and all(v == "IDENTITY" for v in norm_map.values())
            ):
                raise ValueError(
                    f"{where} is LeRobot's normaliser with norm_map {norm_map!r}; a VLA policy never writes it other "
                    "than as identity (the policy normalises; LeRobot's would do it twice). "
                    'Set every norm_map entry to "IDENTITY", or save the policy again with vla'
                )


def make_vla_pre_post_processors(config, dataset_stats: dict | None = None):
    """LeRobot's processor pair for this policy: batch and move to the device in, back to the CPU out; LeRobot's
    normaliser steps as identity (``dataset_stats`` is accepted for LeRobot's factory and changes nothing: the
    policy normalises with its own normalisers)."""
    from lerobot.processor.factory import make_default_policy_processor_steps, make_policy_processor_pipelines

    normalizing = {k: v for k, v in config.normalization_mapping.items() if v is not NormalizationMode.IDENTITY}
    if normalizing:  # LeRobot's steps (below) would normalise what the policy normalises
        raise ValueError(
            f"VLAConfig.normalization_mapping maps {', '.join(normalizing)} to "
            f"{', '.join(v.value for v in normalizing.values())}; the policy normalises with its own "
            "normalisers (action_norm_mode, state_norm_mode): leave every entry IDENTITY"
        )
    steps = make_default_policy_processor_steps(config, None)
    # LeRobot's normaliser steps, identity: lerobot-train --policy.path=DIR hands the new dataset's statistics to them.
    return make_policy_processor_pipelines(
        input_steps=[steps.rename_observations, steps.add_batch_dim, steps.normalize, steps.to_device],
        output_steps=[steps.unnormalize, steps.to_cpu],
    )
