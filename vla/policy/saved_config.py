"""A saved policy's ``config.json``, read and checked: every problem one line naming the file, the field and the fix
(``load_policy_config``), and what a fine-tuning run may change from the folder's settings and which data fits it
(``check_same_policy``, ``check_dataset_fits``)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import draccus
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.io import read_json
from vla.names import suggestion
from vla.policy.configuration_vla import VLAConfig
from vla.run_folder import CHECKPOINTS, POLICY

CONFIG_FILE = "config.json"

# What a config given to from_pretrained (a fine-tuning run's, LeRobot's) may change from the folder's: the optimiser
# and schedule, decoding and execution, augmentation, where and how the weights run. Every other field shaped the
# weights, the token layout or the normalisers the folder holds, and must stay.
LOAD_CHANGEABLE = {
    "device",
    "use_amp",
    "use_peft",
    "push_to_hub",
    "repo_id",
    "private",
    "tags",
    "license",
    "pretrained_path",
    "pretrained_revision",
    "input_features",
    "output_features",
    "backbone_path",
    "attn_implementation",
    "dtype",
    "init_seed",
    "n_action_steps",
    "temporal_ensemble",
    "image_shift",
    "max_prefix_len",
    "max_action_tokens",
    "temperature",
    "top_p",
    "num_beams",
    "commit_search",
    "constrained",
    "use_kv_cache",
    "action_tokenizer_path",
    "action_tokenizer_type",
    "optimizer_lr",
    "optimizer_betas",
    "optimizer_eps",
    "optimizer_weight_decay",
    "optimizer_grad_clip_norm",
    "scheduler_warmup_steps",
    "scheduler_decay_steps",
    "scheduler_decay_lr",
    "fps",
    "delay_ms",  # the delay the chunk was sized for: the chunk itself (time_horizon) stays
}


def load_policy_config(path: str | Path, overrides: list[str] | None = None) -> VLAConfig:
    """The ``VLAConfig`` in ``path / config.json`` (LeRobot's format: the fields plus ``"type": "vla"``), with
    ``overrides`` (``--field=value``) applied. A file that is not JSON, an unknown field, a value of the wrong type
    or an invalid one is one ``ValueError`` naming the file, the field and the fix (draccus' own errors name neither
    the file nor, for a value its checks refuse, the field)."""
    file = Path(path) / CONFIG_FILE
    raw = read_json(file, "VLA policy config")
    kind = raw.pop("type", None)
    if kind != "vla":
        raise ValueError(
            f"{file} holds {'no policy type' if kind is None else f'a policy of type {kind!r}'}, not "
            'a VLA policy\'s config ("type": "vla"); pass a folder saved by vla (save_pretrained)'
        )
    fields = {f.name: f for f in dataclasses.fields(VLAConfig) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(
            f"{file} has a field VLAConfig does not know: {unknown[0]!r}"
            f"{suggestion(unknown[0], fields)}; remove it (or save the policy again with this version "
            "of vla)"
        )
    hints = typing.get_type_hints(VLAConfig)
    for name, value in raw.items():
        if not _fits(hints[name], value):
            default = fields[name].default
            shown = "" if default is dataclasses.MISSING else f" (its default: {json.dumps(draccus.encode(default))})"
            raise ValueError(
                f"{file}: {name} = {json.dumps(value)} is not {_kind(hints[name])}; set it to "
                f"{_kind(hints[name])}{shown}, or save the policy again"
            )
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / CONFIG_FILE
        copy.write_text(json.dumps(raw))
        try:
            return _parse_config(copy, overrides or [])
        except ValueError as err:
            bad = next((o for o in overrides or [] if _refused(copy, o)), None)  # which option, when one is to blame
            if bad is not None:
                raise ValueError(f"--policy.{bad.removeprefix('--')}: {err}; give a valid value") from None
            raise ValueError(f"{file}: {err}; correct it there, or save the policy again") from None


def _parse_config(file: Path, args: list[str]) -> VLAConfig:
    """draccus' parse of a JSON config plus ``--field=value`` args; its error as one line (the config's own checks
    already name the field and the fix)."""
    try:
        with draccus.config_type("json"):
            return draccus.parse(VLAConfig, str(file), args=args)
    except draccus.utils.ParsingError as err:
        cause: BaseException = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, ValueError) and str(cause).startswith("VLAConfig."):
            raise ValueError(str(cause)) from None
        first = str(err).splitlines()[0].rstrip(":")
        reason = first if cause is err else f"{first}: {str(cause).splitlines()[0]}"
        raise ValueError(f"not a valid VLAConfig ({reason})") from None


def _refused(file: Path, arg: str) -> bool:
    try:
        _parse_config(file, [arg])
    except ValueError:
        return True
    return False


def _fits(hint: Any, value: Any) -> bool:
    """Whether a JSON value decodes to the type ``hint`` (None only where the type allows it)."""
    args = typing.get_args(hint)
    if value is None:
        return hint is type(None) or type(None) in args
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(a, value) for a in args if a is not type(None))
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float) and isinstance(value, bool):
        return False
    try:
        draccus.decode(hint, value)
    except Exception:
        return False
    return True


def _kind(hint: Any) -> str:
    """A type in words: ``int | None`` -> "an integer or null"."""
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", Path: "a path (a string)"}
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_kind(a) for a in args if a is not type(None)) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"a list of {_kind(args[0]).split(' ', 1)[-1]}s" if args else "a list"
    if origin is tuple:
        return f"a list of {len(args)} numbers" if args and all(a is float for a in args) else "a list"
    if origin is dict:
        return "an object"
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def check_same_policy(saved: VLAConfig, config: VLAConfig, path: Path) -> None:
    """Refuse a config that differs from the folder's where the weights, tokens or normalisers depend on it."""
    changed = [
        f.name
        for f in dataclasses.fields(VLAConfig)
        if f.name not in LOAD_CHANGEABLE and getattr(saved, f.name) != getattr(config, f.name)
    ]
    if changed:
        detail = "; ".join(f"{n}: {getattr(saved, n)!r} -> {getattr(config, n)!r}" for n in changed[:4])
        raise ValueError(
            f"the policy at {path} was trained with other settings than the config given ({detail}); "
            "its weights, tokenizer and normalisers depend on them: drop those options to use the "
            "folder's, or train a new policy (without --policy.path)"
        )


def check_dataset_fits(
    config: VLAConfig, features: dict[str, Any], path: Path, dataset: Any, fps: float | None = None
) -> None:
    """Refuse a dataset (LeRobot's ``features`` of its info.json, its ``fps``) whose actions, state or cameras are
    not the ones the policy at ``path`` reads and writes (training it there would fail at the first batch, or learn
    nonsense), or whose frame rate is not the one ``config.fps`` records (its chunks would span another time)."""

    def dim(key: str) -> int | None:
        shape = (features.get(key) or {}).get("shape")
        return int(shape[-1]) if shape else None

    theirs = {"actions": dim(ACTION), "state": dim(OBS_STATE)}
    ours = {"actions": config.action_dim, "state": config.state_dim or None}  # state_dim 0: the policy reads none
    wrong = [k for k in ours if ours[k] is not None and theirs[k] != ours[k]]
    if wrong:

        def shown(dims: dict) -> str:
            return ", ".join(f"{'no' if dims[k] is None else f'{dims[k]}-D'} {k}" for k in wrong)

        raise ValueError(
            f"the policy at {path} reads and writes {shown(ours)}, but {dataset} has {shown(theirs)}; "
            "fine-tune it on data of the same robot (the same action and state dimensions), or train a "
            "new policy on this dataset instead of fine-tuning this one"
        )
    missing = [k for k in config.image_keys if k not in features]
    if missing:
        cameras = [k for k in features if k.startswith("observation.image")]
        raise ValueError(
            f"the policy at {path} reads the camera {missing[0]!r}, which {dataset} lacks"
            f"{suggestion(missing[0], cameras)} (its cameras: {', '.join(cameras) or 'none'}); "
            "fine-tune on data with the policy's cameras, or train a new policy"
        )
    if config.fps is not None and fps is not None and float(config.fps) != float(fps):
        t = config.time_horizon
        raise ValueError(
            f"the policy at {path} was trained on {config.fps:g} fps data but {dataset} is {fps:g} fps: its "
            f"{t}-step chunks would span {t / fps:.3g} s instead of {t / config.fps:.3g} s; fine-tune on "
            f"{config.fps:g} fps data, or pass --policy.fps={fps:g} to fine-tune on this data anyway (the policy then "
            f"records {fps:g} fps)"
        )


# --- construction from LeRobot's factory -----------------------------------------------------------------------


def check_policy_folder(path: Path, option: str = "--policy") -> None:
    """``vla serve`` / ``vla eval --policy PATH``, fine-tuning's ``--policy.path PATH`` (``option``): a folder without
    a saved policy's config.json is refused before anything loads, naming the policy inside it when it is a training
    run's folder (its ``policy/``, else its latest checkpoint's)."""
    if (path / CONFIG_FILE).is_file():
        return
    inner = [path / POLICY] + sorted(path.glob(f"{CHECKPOINTS}/*/{POLICY}"), reverse=True)
    found = next((p for p in inner if (p / CONFIG_FILE).is_file()), None)
    if found is not None:
        raise ValueError(f"{path} is a training run's folder, not a policy; did you mean {option} {found}?")
    raise ValueError(
        f"{path} holds no saved policy (no {CONFIG_FILE}); pass the folder a training run wrote "
        "(outputs/train/NAME/policy)"
    )
