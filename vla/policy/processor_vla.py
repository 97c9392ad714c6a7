"""LeRobot's processor pipelines for the VLA policy (``make_vla_pre_post_processors``, found by LeRobot's factory by
its naming convention), and the check that a folder's processor files name only these steps. LeRobot's own commands
find the policy through the plugin distribution in ``plugin/``.

The pipelines batch observations and move them to the device on the way in, and move actions back to the CPU on
the way out. Normalisation, tokenising and packing are the policy's own data pipeline (``vla.pipeline``), run by
``policy.forward`` / ``policy.predict_action_chunk``.
"""

from __future__ import annotations

from pathlib import Path

from vla.io import read_json

PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
# The steps make_vla_pre_post_processors writes. LeRobot's DataProcessorPipeline.from_pretrained imports and calls any
# class a processor file names, so a folder whose files name anything else is refused before LeRobot reads it.
KNOWN_STEPS = ("rename_observations_processor", "to_batch_processor", "device_processor")


def check_processor_files(folder: str | Path) -> None:
    """Refuse processor files that name steps other than this policy's own (code would run on load otherwise)."""
    for name in PROCESSOR_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        steps = read_json(path, "LeRobot processor pipeline").get("steps", [])
        for step in steps if isinstance(steps, list) else [steps]:
            registry = step.get("registry_name") if isinstance(step, dict) else None
            if registry not in KNOWN_STEPS or (isinstance(step, dict) and "class" in step):
                raise ValueError(
                    f"{path} names the processor step {step if registry is None else registry!r}, which a VLA policy "
                    f"never writes (its steps: {', '.join(KNOWN_STEPS)}); loading it through LeRobot would import and "
                    "run that code. Do not load this folder; save the policy again with vla"
                )


def make_vla_pre_post_processors(config, dataset_stats: dict | None = None):
    """LeRobot's processor pair for this policy: batch and move to the device in, back to the CPU out.

    No normalisation steps: the policy normalises with its own saved normalisers (``dataset_stats`` is unused).
    """
    from lerobot.processor.factory import make_default_policy_processor_steps, make_policy_processor_pipelines

    steps = make_default_policy_processor_steps(config, None)
    return make_policy_processor_pipelines(
        input_steps=[steps.rename_observations, steps.add_batch_dim, steps.to_device],
        output_steps=[steps.to_cpu],
    )
