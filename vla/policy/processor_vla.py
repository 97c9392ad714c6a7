"""LeRobot's processor pipelines for the VLA policy (``make_vla_pre_post_processors``, found by LeRobot's factory by
its naming convention), the normalisation steps they hold, and the check that a folder's processor files name only
these steps. LeRobot's own commands find the policy through the plugin distribution in ``plugin/``.

    pre:  rename -> batch -> normalizer_processor (LeRobot's, identity) -> vla_normalizer_processor (state, action)
          -> device
    post: unnormalizer_processor (LeRobot's, identity) -> vla_unnormalizer_processor (action) -> cpu

LeRobot's own normaliser steps are there, mapping every feature type to IDENTITY (``VLAConfig.normalization_mapping``),
only so that ``lerobot-train --policy.path=DIR`` can load the folder: it passes the new dataset's statistics to steps of
those names and refuses a pipeline that has none. With IDENTITY they change nothing, whatever statistics they hold.

The normalisation steps apply the policy's own ``action_tokenizers.Normalizer`` (in float64), so LeRobot's pipelines
(``lerobot-train``, ``lerobot-eval``, ``lerobot-record``) normalise exactly as ``vla``'s own path does. They are ours
and not LeRobot's ``NormalizerProcessorStep`` with QUANTILES because the two formulas differ where it matters: for
a dimension with q01 == q99 (Meta-World's second object in a one-object task: zeros) LeRobot divides by 1e-8 and
maps the constant to -1 and anything else to +-1e8, ours maps it to 0; LeRobot also normalises in float32 and
mean_std divides by std + 1e-8. Neither clips (the tokenizers clip and count).

How the policy knows: the normaliser step marks the batch (``NORMALIZED`` in LeRobot's complementary data, which
reaches the policy as ``batch["vla.normalized"]``); the policy's own ``Normalize`` / ``Unnormalize`` steps
(``vla.policy.pipeline``) then pass the batch through, so ``predict_action_chunk`` returns normalised chunks and the
post-processor unnormalises them. Without the mark (``vla train``, ``vla eval``, serving, or a folder saved before
these steps existed) the policy normalises itself, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import action_tokenizers as at
import numpy as np
import torch
from lerobot.configs import NormalizationMode
from lerobot.processor import ProcessorStep, ProcessorStepRegistry, TransitionKey
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.io import read_json
from vla.policy.pipeline import NORMALIZED

logger = logging.getLogger(__name__)

PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
NORMALIZER_STEP, UNNORMALIZER_STEP = "vla_normalizer_processor", "vla_unnormalizer_processor"
# The steps make_vla_pre_post_processors writes. LeRobot's DataProcessorPipeline.from_pretrained imports and calls any
# class a processor file names, so a folder whose files name anything else is refused before LeRobot reads it.
KNOWN_STEPS = (
    "rename_observations_processor",
    "to_batch_processor",
    NORMALIZER_STEP,
    "device_processor",
    UNNORMALIZER_STEP,
    "normalizer_processor",
    "unnormalizer_processor",
)
LEROBOT_NORMALIZERS = ("normalizer_processor", "unnormalizer_processor")  # accepted only as identity (above)
STEP_KEYS = {"registry_name", "config", "state_file"}  # what LeRobot writes for a registered step


@dataclass
class _Normalization:
    """The policy's normalisers by key (``observation.state``, ``action``): ``modes`` is the step's JSON config,
    the offsets and scales its state (float64 tensors in LeRobot's ``*.safetensors`` beside the JSON)."""

    modes: dict[str, str] = field(default_factory=dict)
    normalizers: dict[str, at.Normalizer] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, normalizers: dict[str, at.Normalizer]):
        return cls(modes={k: n.mode for k, n in normalizers.items()}, normalizers=dict(normalizers))

    def get_config(self) -> dict[str, Any]:
        return {"modes": dict(self.modes)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for key, n in self.normalizers.items():
            out[f"{key}.offset"], out[f"{key}.scale"] = torch.from_numpy(n.offset), torch.from_numpy(n.scale)
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.normalizers = normalizers_from_state(self.modes, state, f"the {type(self).__name__} state")

    def transform_features(self, features):
        return features

    def _apply(self, key: str, value: Any, inverse: bool, dtype: torch.dtype | None) -> Any:
        """``value`` (tensor or array, ``[..., D]``) through the normaliser of ``key``; ``dtype=None`` keeps the
        input's dtype, else the result has ``dtype`` (float64 on the way in: exactly the numbers vla computes)."""
        if key not in self.normalizers:
            if key in self.modes:
                raise ValueError(f"{type(self).__name__} has no statistics for {key!r}; load it with its state file")
            return value
        tensor = torch.as_tensor(value)
        x = tensor.detach().cpu().double().numpy()
        norm = self.normalizers[key]
        out = norm.unnormalize(x) if inverse else norm.normalize(x)
        return torch.from_numpy(out).to(device=tensor.device, dtype=dtype or tensor.dtype)


@ProcessorStepRegistry.register(name=NORMALIZER_STEP)
@dataclass
class VLANormalizerProcessorStep(_Normalization, ProcessorStep):
    """Raw ``observation.state`` and (in training) ``action`` -> normalised with the policy's normalisers, as
    float64; marks the batch as normalised (``NORMALIZED``) so the policy does not normalise it again."""

    def __call__(self, transition: dict) -> dict:
        out = transition.copy()
        obs = out.get(TransitionKey.OBSERVATION)
        if obs is not None and OBS_STATE in obs:
            state = self._apply(OBS_STATE, obs[OBS_STATE], False, torch.float64)
            out[TransitionKey.OBSERVATION] = {**obs, OBS_STATE: state}
        if out.get(TransitionKey.ACTION) is not None:
            out[TransitionKey.ACTION] = self._apply(ACTION, out[TransitionKey.ACTION], False, torch.float64)
        out[TransitionKey.COMPLEMENTARY_DATA] = {**(out.get(TransitionKey.COMPLEMENTARY_DATA) or {}), NORMALIZED: True}
        return out


@ProcessorStepRegistry.register(name=UNNORMALIZER_STEP)
@dataclass
class VLAUnnormalizerProcessorStep(_Normalization, ProcessorStep):
    """Normalised actions (``[B, D]`` from ``select_action`` or chunks ``[B, T, D]``) -> raw units, same dtype."""

    def __call__(self, transition: dict) -> dict:
        out = transition.copy()
        if out.get(TransitionKey.ACTION) is not None:
            out[TransitionKey.ACTION] = self._apply(ACTION, out[TransitionKey.ACTION], True, None)
        return out


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
                    "than as identity (its own vla_normalizer_processor normalises; LeRobot's would do it twice). "
                    'Set every norm_map entry to "IDENTITY", or save the policy again with vla'
                )
        check_state_files(Path(folder), path, steps if isinstance(steps, list) else [steps])


def normalizers_from_state(
    modes: dict[str, str], state: dict[str, torch.Tensor], where: str
) -> dict[str, at.Normalizer]:
    """The normalisers a step's state holds (``{key}.offset`` / ``{key}.scale`` per key of ``modes``), each checked
    as a saved normaliser is (``Normalizer.from_dict``: float, finite, within bounds, no scale of 0); ``where`` (the
    state file, or the step) starts every error."""
    out = {}
    for key, mode in modes.items():
        values = {}
        for part in ("offset", "scale"):
            tensor = state.get(f"{key}.{part}")
            if tensor is None:
                raise ValueError(f"{where} lacks {key}.{part}; save the policy again")
            if not torch.as_tensor(tensor).is_floating_point():
                raise ValueError(f"{where}: {key}.{part} is {tensor.dtype}, not floating point; save the policy again")
            values[part] = torch.as_tensor(tensor).double().numpy()
        try:
            out[key] = at.Normalizer.from_dict({"mode": mode, **values})
        except ValueError as err:
            raise ValueError(f"{where}: {key}: {err}") from None
    return out


def check_state_files(folder: Path, path: Path, steps: list) -> None:
    """The normalisers in the state files of this policy's normalisation steps, read and checked as on load."""
    from action_tokenizers.io import read_tensors

    for step in steps:
        if step.get("registry_name") not in (NORMALIZER_STEP, UNNORMALIZER_STEP) or not step.get("state_file"):
            continue
        file = folder / str(step["state_file"])
        if file.parent != folder:
            name = step["state_file"]
            raise ValueError(f"{path} names the state file {name!r} outside the folder; save the policy again with vla")
        if not file.is_file():
            raise ValueError(f"{file} is missing ({path} names it); save the policy again")
        modes = (step.get("config") or {}).get("modes") if isinstance(step.get("config"), dict) else None
        if not isinstance(modes, dict):
            name = step["registry_name"]
            raise ValueError(f"{path}: the step {name!r} has no modes in its config; save the policy again with vla")
        normalizers_from_state(modes, read_tensors(file, {}, "save the policy again"), str(file))


def make_vla_pre_post_processors(
    config, dataset_stats: dict | None = None, *, normalizers: dict[str, at.Normalizer] | None = None
):
    """LeRobot's processor pair for this policy: batch, normalise and move to the device in; unnormalise and back
    to the CPU out.

    The normalisers are ``normalizers`` (``{"observation.state": ..., "action": ...}``: the policy's own, when it
    saves itself), else built from ``dataset_stats`` exactly as the policy builds its own (LeRobot's factory passes
    the dataset's stats to both). With neither, or with relative actions (the policy subtracts the raw state before
    normalising, so it must see raw numbers), no normalisation steps: the policy then normalises itself.
    """
    from lerobot.processor.factory import make_default_policy_processor_steps, make_policy_processor_pipelines

    relative = getattr(config, "relative_actions", "none")
    if relative != "none" and (isinstance(relative, str) or any(relative)):
        normalizers = dataset_stats = None
    if normalizers is None and dataset_stats is not None:
        normalizers = {
            OBS_STATE: normalizer_from_stats(dataset_stats, OBS_STATE, config.state_norm_mode),
            ACTION: normalizer_from_stats(dataset_stats, ACTION, config.action_norm_mode),
        }
    steps = make_default_policy_processor_steps(config, None)
    normalize = [VLANormalizerProcessorStep.of(normalizers)] if normalizers else []
    unnormalize = [VLAUnnormalizerProcessorStep.of({ACTION: normalizers[ACTION]})] if normalizers else []
    identity = {k: v for k, v in config.normalization_mapping.items() if v is not NormalizationMode.IDENTITY}
    if identity:  # LeRobot's steps (below) would normalise what ours already normalised
        raise ValueError(
            f"VLAConfig.normalization_mapping maps {', '.join(identity)} to "
            f"{', '.join(v.value for v in identity.values())}; the policy normalises with its own "
            "normalisers (action_norm_mode, state_norm_mode): leave every entry IDENTITY"
        )
    # LeRobot's normaliser steps, identity: lerobot-train --policy.path=DIR hands the new dataset's stats to them.
    return make_policy_processor_pipelines(
        input_steps=[steps.rename_observations, steps.add_batch_dim, steps.normalize, *normalize, steps.to_device],
        output_steps=[steps.unnormalize, *unnormalize, steps.to_cpu],
    )


def normalizer_from_stats(stats: dict[str, dict[str, Any]] | None, key: str, mode: str) -> at.Normalizer:
    """The normaliser of ``key`` from LeRobot's dataset stats (``{key: {"q01": ..., "q99": ..., ...}}``)."""
    if stats is None or key not in stats:
        raise ValueError(
            f"no normaliser for {key!r}: pass {'action' if key == ACTION else 'state'}_normalizer=at.Normalizer(...) "
            f"or dataset_stats holding {key!r} (LeRobot's factory passes the dataset's stats)"
        )
    entry = {k: np.asarray(torch.as_tensor(v).cpu(), dtype=np.float64) for k, v in stats[key].items()}
    if mode == "quantile" and {"q01", "q99", "min", "max"} <= entry.keys():
        # LeRobot 0.6 averages per-episode quantiles: a dimension that is constant within each episode but not
        # across them (a goal, an object's start) gets q01 == q99, and the policy cannot see it.
        collapsed = np.flatnonzero((entry["q99"] - entry["q01"] < 1e-8) & (entry["max"] - entry["min"] > 1e-6))
        if len(collapsed):
            logger.warning(
                "%s: dimensions %s vary (min < max) but their q01 == q99 in these stats, so quantile normalisation "
                "hides them. LeRobot's stats.json averages per-episode quantiles; normalise with exact ones "
                "(`vla data stats`, or vla.data.stats.frame_stats as `vla train` does) or use the mean_std mode.",
                key,
                collapsed.tolist(),
            )
    return at.Normalizer.from_stats(entry, mode)
