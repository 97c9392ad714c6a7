"""The settings ``vla train`` chooses from the dataset when the user leaves them unset, each with its reason; ``vla
data info`` prints the same choices (this module's ``choose``, not a copy) and what in the data will hurt.

    cfg = vla.data.defaults.resolve(cfg, info, log=print)   # every unset setting fixed, one line each; cfg.chosen: the whys
    cfg, choices = vla.data.defaults.choose(cfg, info)      # the same, quietly: [Choice(name, value, why, given)]
    facts = Facts.read(info)                           # what the choices rest on: state matching, grippers, constants

"Unset" is None (``"auto"`` for ``vision_encoder``, ``relative_actions`` and ``decoding``). ``vla train`` without
``--config_path`` starts from ``FROM_DATA`` (all of them unset), so only what the user gives is fixed and anything
given wins; a config file starts from the fixed defaults (``VLAConfig``'s: T=10, one state, absolute actions, no
held-out split), so every configs/*.yaml runs as it was measured, and writes ``null`` / ``auto`` for what it wants
chosen here.

The choices, and why (the measured configs they come from):
  policy.image_keys            every camera of the dataset
  policy.vision_encoder        ``conv`` for cameras learnt from scratch (configs/images.yaml: 34% success on push-v3
                               from pixels, SigLIP from scratch 6%); ``siglip`` with a pretrained backbone_path
  policy.time_horizon          ``round(chunk_seconds * fps)``, ``CHUNK_SECONDS`` when chunk_seconds is unset; with
                               ``delay_ms``, at least the delay's steps plus the actions run per chunk (``_chunk``)
  policy.n_action_steps        half the chunk (the fixed recipe's 5 of 10)
  policy.n_obs_steps           ``STATE_HISTORY`` for a policy that reads a state and no camera (positions do not show
                               motion; configs/piper_grape.yaml needed 3 states to beat holding the state), else 1
  policy.action_state_dims     ``match_state``: by name, else by values, else one to one when the dims agree
  policy.relative_actions      the action dims whose matched state dim tracks them (``TRACKS``), grippers absolute
  policy.scheduler_decay_steps the run's steps: the cosine decay ends at the last step
  policy.decoding              one pass for binning, one id at a time for the others (``chosen_decoding``)
  heldout_episodes             ``HELDOUT_SHARE`` (at least one episode) when there are two or more: the offline report
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data import reader
from vla.policy.configuration_vla import AUTO, chosen_decoding

# The chunk's default length: the configs that work span 0.125 s (push-v3, 80 Hz, T=10) to 1 s (ALOHA, 50 Hz, T=50),
# piper_grape's best 0.33 s (15 Hz, T=5); 0.5 s beat both baselines on piper_grape, piper_fruit and so101_orange_cube
# with nothing else given (results/own_dataset/README.md)
CHUNK_SECONDS = 0.5
STATE_HISTORY = 3  # states a state-only policy reads (configs/piper_grape.yaml's n_obs_steps)
HELDOUT_SHARE = 0.1  # share of episodes kept out for the offline report
TRACKS = 0.5  # an action dim tracks a state dim when RMS(action - state) < TRACKS * std(action)
NEAR_CONSTANT = 0.05  # a dim whose q01..q99 spans under this share of its feature's median span barely moves
GRIPPER_WORDS = ("grip", "claw", "finger", "jaw")  # an action dim so named is a gripper: kept absolute
SAMPLE_FRAMES = 200_000  # frames read for the facts (whole episodes, evenly spaced): enough, and quick
SHORT_CHUNKS = 2  # an episode under this many chunks long is short (most of its chunks run past its end)

# `vla train` without a config file starts here: every setting this module chooses left unset.
FROM_DATA: dict[str, Any] = {
    "heldout_episodes": None,
    "policy": {
        "image_keys": None,
        "vision_encoder": AUTO,
        "time_horizon": None,
        "n_action_steps": None,
        "n_obs_steps": None,
        "relative_actions": AUTO,
        "scheduler_decay_steps": None,
        "decoding": AUTO,
    },
}


@dataclass(frozen=True)
class Choice:
    """One setting: its value, and why (empty when the user gave it)."""

    name: str  # as on the command line, e.g. "policy.time_horizon"
    value: Any
    why: str = ""
    given: bool = False

    def line(self) -> str:
        return (
            f"{self.name} = {_text(self.value)} (given)"
            if self.given
            else f"{self.name} = {_text(self.value)}: {self.why}"
        )


@dataclass(frozen=True)
class Facts:
    """What the choices rest on, read once from (a sample of) the frames."""

    action_state_dims: list[int] | None  # the matched state dim of each action dim (match_state), or None
    how: str  # how they were matched, or why none was
    distance: np.ndarray | None  # float64 [A, S]: RMS(action_i - state_j) / std(action_i); None without a state
    grippers: list[int]  # action dims named like a gripper
    spans: dict[str, np.ndarray]  # feature -> float64 [dim]: the q01..q99 span of each dim
    frames: int  # frames the facts were read from

    @classmethod
    def read(cls, info: reader.DatasetInfo) -> Facts:
        key = (str(info.root), info.num_frames, info.num_episodes)
        if key not in _FACTS:
            _FACTS.clear()  # one dataset at a time: the cache only spares training reading the frames twice
            _FACTS[key] = cls._read(info)
        return _FACTS[key]

    @classmethod
    def _read(cls, info: reader.DatasetInfo) -> Facts:
        vectors = [ACTION] + ([OBS_STATE] if info.state_dim is not None else [])
        frames = reader._read_frames(info, _sample_episodes(info), vectors)
        arrays = {k: frames[k].astype(np.float64) for k in vectors}
        finite = np.all([np.isfinite(a).all(axis=1) for a in arrays.values()], axis=0)  # [F] rows without NaN/inf
        arrays = {k: a[finite] for k, a in arrays.items()}
        spans = {
            k: (np.quantile(a, 0.99, axis=0) - np.quantile(a, 0.01, axis=0)) if len(a) else np.zeros(a.shape[1])
            for k, a in arrays.items()
        }
        grippers = [i for i, n in enumerate(info.action_names or []) if any(w in n.lower() for w in GRIPPER_WORDS)]
        if OBS_STATE not in arrays:
            return cls(None, "the dataset has no observation.state", None, grippers, spans, int(finite.sum()))
        distance = track_distance(arrays[ACTION], arrays[OBS_STATE])
        dims, how = match_state(distance, info.action_names, info.state_names)
        return cls(dims, how, distance, grippers, spans, int(finite.sum()))

    def tracks(self, dims: list[int]) -> list[bool]:
        """Per action dim: does state dim ``dims[i]`` track it (``TRACKS``)?"""
        if self.distance is None:
            return [False] * len(dims)
        bad = [j for j in dims if not 0 <= j < self.distance.shape[1]]
        if len(dims) != self.distance.shape[0] or bad:
            raise ValueError(
                f"policy.action_state_dims = {dims} is invalid: give one state dim in [0, "
                f"{self.distance.shape[1]}) per action dim ({self.distance.shape[0]})"
            )
        return [bool(self.distance[i, j] < TRACKS) for i, j in enumerate(dims)]

    def barely_moving(self, feature: str) -> tuple[list[int], list[int]]:
        """(constant dims, near-constant dims) of ``feature``: q01..q99 spans 0, or under ``NEAR_CONSTANT`` of the
        feature's median span."""
        span = self.spans.get(feature)
        if span is None or not len(span):
            return [], []
        constant = [int(i) for i in np.flatnonzero(span <= 0)]
        median = float(np.median(span[span > 0])) if (span > 0).any() else 0.0
        near = [int(i) for i in np.flatnonzero((span > 0) & (span < NEAR_CONSTANT * median))] if len(span) > 2 else []
        return constant, near


_FACTS: dict[tuple, Facts] = {}


def track_distance(action: np.ndarray, state: np.ndarray) -> np.ndarray:
    """float64 [A, S]: for frames ``action`` [F, A] and ``state`` [F, S], RMS(action_i - state_j) / std(action_i): near
    0 where a state dim holds an action dim's quantity (the commanded position and the measured one), about 1 or more
    where it does not. A constant action dim: 0 against an equal state dim, inf against any other."""
    rms = np.sqrt(((action[:, :, None] - state[:, None, :]) ** 2).mean(axis=0))  # [A, S]
    std = action.std(axis=0)[:, None]  # [A, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(std > 0, rms / np.where(std > 0, std, 1.0), np.where(rms == 0, 0.0, np.inf))


def match_state(
    distance: np.ndarray, action_names: list[str] | None, state_names: list[str] | None
) -> tuple[list[int] | None, str]:
    """The state dim of each action dim, and how it was found: (1) by name, when every action name is a state name;
    (2) by values, when every action dim tracks one state dim of its own (``distance`` [A, S] < ``TRACKS``); (3) one
    to one, when the dims agree. (None, why) when none applies."""
    a, s = distance.shape
    if action_names and state_names and set(action_names) <= set(state_names):
        return [state_names.index(n) for n in action_names], "matched by name"
    nearest = distance.argmin(axis=1) if s else np.zeros(0, int)
    if s and (distance[np.arange(a), nearest] < TRACKS).all() and len(set(nearest.tolist())) == a:
        named = " (the names differ)" if action_names and state_names else ""
        if a == s and (nearest == np.arange(a)).all():
            return list(range(a)), f"one to one: the dims agree ({a}) and each state dim tracks its action dim"
        return [int(j) for j in nearest], f"matched by values: each action dim tracks one state dim{named}"
    if a == s:
        return list(
            range(a)
        ), f"one to one: the dims agree ({a}), though the values do not show the state tracking the action"
    return None, (f"no state dim matches: the {s}-D state's names and values do not hold the {a}-D action's quantities")


def _sample_episodes(info: reader.DatasetInfo) -> list[int]:
    """Whole episodes, evenly spaced, up to ``SAMPLE_FRAMES`` frames (at least one episode)."""
    if info.num_frames <= SAMPLE_FRAMES:
        return info.episode_index.tolist()
    n = max(1, int(info.num_episodes * SAMPLE_FRAMES / info.num_frames))
    picked = np.unique(np.linspace(0, info.num_episodes - 1, n).round().astype(int))
    return info.episode_index[picked].tolist()


# --- the choices -------------------------------------------------------------------------------------------------
def action_state(policy, info: reader.DatasetInfo, facts: Facts | None = None):
    """``policy`` (a ``VLAConfig``) with ``action_state_dims`` and ``relative_actions`` fixed from the dataset, and
    the two ``Choice``s: the matched state dims (``match_state``), and ``"auto"`` turned into its mask (the dims whose
    state dim tracks them, grippers absolute; "none" when no state matches)."""
    names = info.action_names or [f"action[{i}]" for i in range(info.action_dim)]
    relative = policy.relative_actions
    if policy.state_dim == 0 or info.state_dim is None:  # no state: nothing to match the actions to
        why = "the policy reads no state" if info.state_dim is not None else "the dataset has no observation.state"
        relative = "none" if relative == AUTO else relative
        return dataclasses.replace(policy, action_state_dims=None, relative_actions=relative), [
            Choice("policy.action_state_dims", None, why),
            Choice("policy.relative_actions", relative, why),
        ]
    facts = facts or Facts.read(info)
    dims, choices = policy.action_state_dims, []
    if dims is None:
        dims = facts.action_state_dims
        pairs = (
            ""
            if dims is None
            else " (" + ", ".join(f"{names[i]} <- {_state_name(info, j)}" for i, j in enumerate(dims)) + ")"
        )
        choices.append(Choice("policy.action_state_dims", dims, facts.how + pairs))
    else:
        choices.append(Choice("policy.action_state_dims", dims, given=True))
    if relative == AUTO:
        if dims is None:
            relative, why = "none", "no state dim matches the action, so every dim is predicted absolute"
        else:
            tracks = facts.tracks(dims)
            relative = [t and i not in facts.grippers for i, t in enumerate(tracks)]
            parts = [f"relative to the state: {_listed(names, [i for i, r in enumerate(relative) if r])}"]
            if facts.grippers:
                parts.append(f"grippers kept absolute: {_listed(names, facts.grippers)}")
            elif info.action_names is None:
                parts.append("no action names, so no gripper can be found by name")
            untracked = [i for i, t in enumerate(tracks) if not t and i not in facts.grippers]
            if untracked:
                parts.append(f"absolute, their state dim does not track them: {_listed(names, untracked)}")
            why = "; ".join(parts)
        choices.append(Choice("policy.relative_actions", relative, why))
    else:
        choices.append(Choice("policy.relative_actions", relative, given=True))
    return dataclasses.replace(policy, action_state_dims=dims, relative_actions=relative), choices


def choose(cfg, info: reader.DatasetInfo, facts: Facts | None = None):
    """``(cfg, choices)``: the ``TrainConfig`` with every unset setting chosen from ``info`` (see the module
    docstring), and one ``Choice`` per setting this module chooses, given or chosen, in the order they are made."""
    p, choices = cfg.policy, []

    def pick(name: str, value: Any, unset: bool, chosen: Any, why: str) -> Any:
        choices.append(Choice(name, chosen, why) if unset else Choice(name, value, given=True))
        return chosen if unset else value

    cams = ", ".join(info.camera_text(k) for k in info.camera_keys)
    keys = pick(
        "policy.image_keys",
        p.image_keys,
        p.image_keys is None,
        list(info.camera_keys),
        f"every camera of the dataset: {cams}" if cams else "the dataset has no camera: state and task only",
    )
    encoder = pick("policy.vision_encoder", p.vision_encoder, p.vision_encoder == AUTO, *_encoder(keys, p))
    seconds, horizon, why = _chunk(p, info)
    horizon = pick("policy.time_horizon", p.time_horizon, horizon is not None, horizon, why)
    n_action = pick(
        "policy.n_action_steps",
        p.n_action_steps,
        p.n_action_steps is None,
        max(1, horizon // 2),
        "half the chunk runs before the next is predicted (the fixed recipe's 5 of 10)",
    )
    if not 1 <= n_action <= horizon:  # a T decided here (chunk_seconds, a delay) bounds what was given before it
        raise ValueError(
            f"VLAConfig.n_action_steps = {n_action} is invalid: use 1 <= n_action_steps <= time_horizon ({horizon}), "
            "the chunk chosen for this dataset, or None (half the chunk)"
        )
    history = pick("policy.n_obs_steps", p.n_obs_steps, p.n_obs_steps is None, *_history(p, info, keys))
    decay = pick(
        "policy.scheduler_decay_steps",
        p.scheduler_decay_steps,
        p.scheduler_decay_steps is None,
        cfg.steps,
        f"the run's steps ({cfg.steps}): the cosine decay ends at the last step",
    )
    heldout = pick("heldout_episodes", cfg.heldout_episodes, cfg.heldout_episodes is None, *_heldout(info))
    decoding = pick("policy.decoding", p.decoding, p.decoding == AUTO, *chosen_decoding(cfg.tokenizer.type))

    policy = dataclasses.replace(
        p,
        image_keys=keys,
        vision_encoder=encoder,
        time_horizon=horizon,
        chunk_seconds=seconds,
        n_action_steps=n_action,
        n_obs_steps=history,
        scheduler_decay_steps=decay,
        decoding=decoding,
    )
    facts = facts if facts is not None or info.state_dim is None or p.state_dim == 0 else Facts.read(info)
    policy, more = action_state(policy, info, facts)
    choices += more
    chosen = {c.name: f"{_text(c.value)}: {c.why}" for c in choices if not c.given}
    return dataclasses.replace(cfg, policy=policy, heldout_episodes=heldout, chosen=chosen), choices


def _encoder(keys: list[str], p) -> tuple[str, str]:
    """The vision encoder for cameras ``keys``, and why."""
    if not keys:
        return "siglip", "no camera is read (unused)"
    if p.backbone_path:
        return "siglip", "PaliGemma's own tower, pretrained (backbone_path)"
    return "conv", (
        "cameras learnt from scratch: the conv stem learns to see where SigLIP from scratch "
        "learns to ignore the camera (configs/images.yaml: 34% against 6% on push-v3)"
    )


def _chunk(p, info: reader.DatasetInfo) -> tuple[float | None, int | None, str]:
    """``(chunk_seconds, T, why)``: T from ``chunk_seconds`` (given, or the default when T is unset) at the data's fps,
    raised to cover ``delay_ms`` when one is given, cut to the longest episode; T None when ``time_horizon`` is given
    without ``chunk_seconds`` or a delay (it stands)."""
    seconds = p.chunk_seconds
    if seconds is None and p.time_horizon is not None:
        if not p.delay_ms:
            return seconds, None, ""
        horizon, why = p.time_horizon, f"policy.time_horizon={p.time_horizon}"
    else:
        from_user = seconds is not None
        seconds = seconds if from_user else CHUNK_SECONDS
        horizon = max(1, round(seconds * info.fps))
        source = "policy.chunk_seconds" if from_user else "the default chunk, policy.chunk_seconds unset"
        why = f"{seconds:g} s at {info.fps} fps ({source})"
        if from_user and p.time_horizon is not None and p.time_horizon != horizon:
            why += f"; chunk_seconds decides T, not time_horizon={p.time_horizon}"
    given = seconds is None  # time_horizon as given, which stands unless the delay needs more
    if p.delay_ms:  # the actions run from a chunk must last while the next one is on its way
        steps = math.ceil(p.delay_ms * info.fps / 1000 - 1e-9)
        need = steps + (p.n_action_steps or steps)
        if horizon < need:
            given = False
            runs = f"{p.n_action_steps} actions run" if p.n_action_steps else "half a chunk runs"
            lasts = f"a {p.delay_ms:g} ms delay lasts {steps} steps at {info.fps} fps"
            horizon, why = (
                need,
                f"{why}, raised to {need}: {lasts}, and {runs} from each chunk after it (policy.delay_ms)",
            )
    if given:
        return seconds, None, ""
    longest = int(info.episode_lengths.max())
    if horizon > longest:
        horizon, why = longest, why + f", cut to the longest episode ({longest} frames)"
    return seconds, horizon, why


def _history(p, info: reader.DatasetInfo, keys: list[str]) -> tuple[int, str]:
    """How many states the policy is shown, and why."""
    if info.state_dim is None or p.state_dim == 0:
        return 1, "the policy reads no state"
    if keys:
        return 1, "the policy reads cameras: the current state with them"
    return STATE_HISTORY, (
        f"state only: positions alone do not show motion; the last {STATE_HISTORY} "
        "states show it (configs/piper_grape.yaml's recipe)"
    )


def _heldout(info: reader.DatasetInfo) -> tuple[float, str]:
    """The share of episodes held out for the offline report, and why."""
    if info.num_episodes < 2:
        return 0.0, "one episode: nothing to hold out, so no offline report"
    n = min(max(1, round(HELDOUT_SHARE * info.num_episodes)), info.num_episodes - 1)
    return HELDOUT_SHARE, (
        f"{n} of {info.num_episodes} episodes kept out of training for the offline "
        "report (the policy against the mean-action and hold-the-state baselines)"
    )


def resolve(cfg, info: reader.DatasetInfo, log=print):
    """``choose``, printing one line per choice (and one for the settings given) and what in the data will hurt. A
    resumed run (``--resume=true`` on a folder holding its train_config.json) keeps the choices it started with."""
    saved = _saved_run(cfg)
    if saved is not None:
        cfg = _unset_from(cfg, saved)
    cfg, choices = choose(cfg, info)
    if saved is not None:
        cfg = dataclasses.replace(cfg, chosen=dict(saved.get("chosen") or {}))
        choices = [
            Choice(c.name, c.value, "kept from the run being resumed") if c.name in cfg.chosen else c for c in choices
        ]
    if log is not None:
        for c in choices:
            if not c.given:
                log(f"chose {c.line()}")
        given = [f"{c.name}={_text(c.value)}" for c in choices if c.given]
        if given:
            log(f"given: {', '.join(given)}")
        for warning in warnings(info, cfg.policy):
            log(f"WARNING: {warning}")
    return cfg


def _saved_run(cfg) -> dict | None:
    """The run's own train_config.json when ``cfg`` resumes one, else None."""
    from vla.io import read_json
    from vla.run_folder import RunFolder

    path = RunFolder(cfg.output_dir).config
    return read_json(path, "the run's config") if cfg.resume and path.is_file() else None


def _unset_from(cfg, saved: dict):
    """``cfg`` with each setting this module chooses that is unset in it taken from ``saved`` (a run's config)."""
    policy, mine = saved.get("policy") or {}, {}
    for name in (*FROM_DATA["policy"], "chunk_seconds", "action_state_dims"):
        if getattr(cfg.policy, name) in (None, AUTO) and name in policy:
            mine[name] = policy[name]
    heldout = saved.get("heldout_episodes") if cfg.heldout_episodes is None else cfg.heldout_episodes
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, **mine), heldout_episodes=heldout)


# --- what will hurt ----------------------------------------------------------------------------------------------
def warnings(info: reader.DatasetInfo, policy, facts: Facts | None = None) -> list[str]:
    """One line per thing in the data that will hurt a policy with ``policy``'s (resolved) settings."""
    out = list(info.notes)
    facts = facts or Facts.read(info)
    for feature, label, names in ((ACTION, "action", info.action_names), (OBS_STATE, "state", info.state_names)):
        constant, near = facts.barely_moving(feature)
        if constant:
            out.append(
                f"{label} dims {_listed(names, constant)} never change over {facts.frames} frames: they carry "
                "nothing to learn or to read"
            )
        if near:
            span = facts.spans[feature]
            out.append(
                f"{label} dims {_listed(names, near)} barely move (q01..q99 spans "
                f"{', '.join(f'{span[i]:.3g}' for i in near)} against a median {np.median(span[span > 0]):.3g} "
                "over the others): normalised to [-1, 1], their noise looks like motion"
            )
    horizon = policy.time_horizon
    if horizon:
        short = int((info.episode_lengths < horizon).sum())
        brief = int((info.episode_lengths < SHORT_CHUNKS * horizon).sum()) - short
        if short:
            out.append(
                f"{short} of {info.num_episodes} episodes are shorter than the chunk ({horizon} frames): most "
                "of their chunks are padding; use a shorter --policy.chunk_seconds or drop them"
            )
        if brief:
            out.append(
                f"{brief} of {info.num_episodes} episodes are under {SHORT_CHUNKS} chunks long ({SHORT_CHUNKS * horizon}"
                " frames): most of their chunks run past the episode's end"
            )
    if info.state_dim is not None and policy.state_dim != 0:
        named = info.action_names and info.state_names
        if named and not set(info.action_names) <= set(info.state_names):
            dims = policy.action_state_dims
            out.append(
                "state and action are named differently ("
                + ", ".join(info.action_names[:3])
                + " ... against "
                + ", ".join(info.state_names[:3])
                + " ...): "
                + (
                    f"matched by values as {dims}; check it, or give --policy.action_state_dims"
                    if dims is not None
                    else "no match found; give --policy.action_state_dims if the state holds the action's quantities"
                )
            )
        elif policy.action_state_dims is None:
            out.append(
                "no state dim matches the action: no relative actions and no hold-the-state baseline; give "
                "--policy.action_state_dims if the state holds the action's quantities"
            )
    if 2 <= info.num_episodes < 10:
        out.append(
            f"only {info.num_episodes} episodes: the held-out report rests on one or two of them, and a policy "
            "sees few ways through the task"
        )
    return out


def describe(info: reader.DatasetInfo, cfg) -> list[str]:
    """``vla data info``'s lines: what ``vla train --dataset_root DIR`` would choose, and the warnings."""
    resolved, choices = choose(cfg, info)
    lines = ["what `vla train --dataset_root DIR` would choose:"] + [f"  {c.line()}" for c in choices]
    hurts = warnings(info, resolved.policy)
    lines += [f"  WARNING: {w}" for w in hurts] or ["  nothing in the data looks harmful"]
    return lines


def _listed(names: list[str] | None, dims: list[int]) -> str:
    return ", ".join(f"{i} ({names[i]})" if names else str(i) for i in dims) or "none"


def _state_name(info: reader.DatasetInfo, j: int) -> str:
    return info.state_names[j] if info.state_names else f"state[{j}]"


def _text(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, bool) for v in value):
        return "[" + ", ".join("true" if v else "false" for v in value) + "]"
    return "null" if value is None else str(value)
