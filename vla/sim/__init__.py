"""Simulators behind one interface: an environment named by family and task, its scripted expert, a registry.

    env = make_env("metaworld/push-v3", image_keys=["observation.images.corner2"], image_size=128)
    obs = env.reset(seed=EVAL_SEED_START)        # a dict with a dataset sample's keys (vla.data.reader's contract)
    obs, reward, done, info = env.step(action)   # action float [env.action_dim]; info["success"]: bool
    env.step(action, render=False)                # the same step, its cameras not drawn (nobody looks at them)
    expert = make_expert("metaworld/push-v3")    # expert.reset(seed); expert(obs) -> actions [k, D]

A simulator family is one module that calls ``register(Family(...))`` (``vla.sim.metaworld_env`` for Meta-World);
recording (``vla.sim.record``), rollouts (``vla.sim.rollout``), evaluation and the CLI only use what is here, so
a new simulator adds one module and one line in ``_FAMILY_MODULES``; its env subclasses ``Episode``, the step loop
every simulator shares (the seed, the action check, the step count and the episode's end, the renderer's release).

Seeds: training recordings draw layouts from seeds ``TRAIN_SEED_START`` upward, evaluation from
``EVAL_SEED_START`` upward; ``record`` refuses seeds that would reach the evaluation range.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vla.names import check_name

# MuJoCo picks its GL backend when it is first imported: choose headless EGL before anything imports it.
# A user's own MUJOCO_GL (osmesa, glfw) wins.
os.environ.setdefault("MUJOCO_GL", "egl")

TRAIN_SEED_START = 0
EVAL_SEED_START = 1_000_000  # far beyond any recording; `record` refuses to cross it
# Every observation convention an env takes (the commands' choices); each env accepts its own (ALOHA's has no "lerobot")
OBSERVATIONS = ("privileged", "proprio", "lerobot")


def lerobot_features(
    state_names: list[str], action_names: list[str], image_keys: list[str], image_size: int
) -> dict[str, dict]:
    """An env's LeRobot feature spec: the state and action vectors by name, and each camera as an "image" feature
    (a recording stores them as video or PNG)."""
    from lerobot.utils.constants import ACTION, OBS_STATE

    features: dict[str, dict] = {
        OBS_STATE: {"dtype": "float32", "shape": (len(state_names),), "names": list(state_names)},
        ACTION: {"dtype": "float32", "shape": (len(action_names),), "names": list(action_names)},
    }
    for key in image_keys:
        shape = (image_size, image_size, 3)
        features[key] = {"dtype": "image", "shape": shape, "names": ["height", "width", "channels"]}
    return features


class Env(Protocol):
    """One task of one simulator, reset per seed. Observations are unbatched dicts with the dataset's keys."""

    name: str  # "family/task", e.g. "metaworld/push-v3"
    task_text: str  # the instruction, a plain sentence ("push the puck to a goal")
    fps: int  # control rate: actions per second
    action_dim: int
    max_steps: int  # an episode is cut (done, not a success) after this many actions
    robot_type: str
    features: dict[str, dict]  # the LeRobot feature spec of what reset/step return (cameras included)
    last_frames: dict[str, Any]  # camera key -> uint8 [H, W, 3] behind the latest observation (what a dataset stores)

    def reset(self, seed: int) -> dict[str, Any]: ...

    # ``render=False``: the caller will not look at this observation's cameras, so none is drawn and the observation
    # carries no image (a rollout renders only the observations a policy is shown).
    def step(self, action: Any, render: bool = True) -> tuple[dict[str, Any], float, bool, dict[str, Any]]: ...

    def hold_action(self, last: Any) -> Any: ...  # what runs while a chunk is late (``Episode.hold_action``)

    def close(self) -> None: ...


class Expert(Protocol):
    """A scripted demonstrator: ``reset(seed)`` at the start of the episode on ``seed``, then ``obs -> [k, D]``."""

    def reset(self, seed: int) -> None: ...

    def __call__(self, obs: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Family:
    """A simulator: how to list its tasks, build an env for one, and build that task's expert."""

    name: str  # "metaworld"
    tasks: Callable[[], list[str]]
    make_env: Callable[..., Env]  # (task, *, image_keys, image_size, max_steps) -> Env
    make_expert: Callable[[str], Expert]
    default_task: str
    default_cameras: tuple[str, ...]  # the dataset keys `vla data record --images` records
    task_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # named groups, e.g. "mt10" -> ten tasks
    # The expert reacts to each observation (Meta-World's); False for one planned at reset and replayed (ALOHA's),
    # which DART noise (record's action_noise) would push off its plan with nothing to correct it.
    closed_loop_expert: bool = True


FAMILIES: dict[str, Family] = {}
# Families imported on first use (their simulators are slow to import).
_FAMILY_MODULES = {"metaworld": "vla.sim.metaworld_env", "toy": "vla.sim.toy_env", "aloha": "vla.sim.aloha"}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def family(name: str) -> Family:
    """The simulator family called ``name`` (imported on first use)."""
    check_name("simulator", name, _FAMILY_MODULES)
    if name not in FAMILIES:
        importlib.import_module(_FAMILY_MODULES[name])
    return FAMILIES[name]


def split_name(name: str) -> tuple[Family, str]:
    """``"metaworld/push-v3"`` -> (the family, ``"push-v3"``), both checked."""
    if not isinstance(name, str) or name.count("/") != 1:
        raise ValueError(f"name an environment as family/task, e.g. 'metaworld/push-v3'; got {name!r}")
    family_name, task = name.split("/")
    fam = family(family_name)
    check_name(f"{family_name} task", task, fam.tasks())
    return fam, task


def checked_max_steps(max_steps: int | None, default: int) -> int:
    """An episode's step limit: ``default`` when unset, else a positive integer."""
    steps = default if max_steps is None else int(max_steps)
    if steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    return steps


def checked_action(action: Any, action_dim: int, running: bool, what: str) -> Any:
    """An env's ``step`` argument as float64 [action_dim], or a clear error: no episode running (``running`` False),
    a wrong shape, a non-finite value. ``what`` names the actions in the message ("Meta-World actions")."""
    import numpy as np

    if not running:
        raise RuntimeError("no episode is running (it ended, or never began): call reset(seed) first")
    action = np.asarray(action, dtype=np.float64).reshape(-1)
    if action.shape != (action_dim,):
        raise ValueError(f"{what} are float [{action_dim}], got shape {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action has non-finite values: {action}")
    return action


class Episode:
    """What every simulator's step loop shares, written once: an episode begun from a checked seed (``begin``), each
    action checked while one runs (``checked``), its end counted (``end_step``: success, failure or the step limit),
    the cameras drawn into an observation (``with_images``) and the renderer released by ``close`` (also as
    ``with env: ...``). A simulator sets ``max_steps`` and, when it renders, ``image_keys``, ``last_frames``,
    ``render(key)`` and ``_renderer``."""

    max_steps: int
    image_keys: list[str] | tuple[str, ...] = ()
    last_frames: dict[str, Any]
    _renderer: Any = None
    _steps: int = 0
    _done: bool = True

    def begin(self, seed: int) -> int:
        """Start counting a new episode; ``seed`` as a non-negative int, or a ``ValueError``."""
        if seed is None or int(seed) < 0:
            raise ValueError(f"reset needs a non-negative integer seed, got {seed!r}")
        self._steps, self._done = 0, False
        return int(seed)

    def checked(self, action: Any, action_dim: int, what: str) -> Any:
        return checked_action(action, action_dim, not self._done, what)

    def end_step(self, success: bool, failed: bool = False, cut: bool = False) -> tuple[bool, bool]:
        """Count one step; returns ``(done, truncated)``: truncated at the step limit (or when the simulator ``cut``
        the episode itself), done at success, failure or truncation."""
        self._steps += 1
        truncated = bool(cut) or self._steps >= self.max_steps
        self._done = bool(success or failed or truncated)
        return self._done, truncated

    def with_images(self, obs: dict[str, Any], render: bool = True) -> dict[str, Any]:
        """``obs`` with each camera's image now (float32 [3, H, W] in [0, 1], LeRobot's layout; the uint8 [H, W, 3]
        frame behind it, what a recording stores, in ``last_frames``). With ``render`` False nothing is drawn: the
        observation carries no image and ``last_frames`` is emptied, so no stale frame passes for this step's."""
        self.last_frames.clear()
        if render:
            for key in self.image_keys:
                self.last_frames[key] = frame = self.render(key)
                obs[key] = frame.transpose(2, 0, 1).astype("float32") / 255.0
        return obs

    def render(self, key: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no cameras")

    def hold_action(self, last: Any) -> Any:
        """What the robot runs while it waits for a late chunk, given the last action it ran: by default that action
        again (a position target holds the pose). A simulator whose actions are displacements or velocities
        overrides it."""
        return last

    def close(self) -> None:
        """Release the renderer (EGL contexts left to interpreter teardown print errors)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def env_names(spec: str) -> list[str]:
    """The environments a spec names: ``"metaworld/push-v3"`` -> itself; a task set, ``"metaworld/mt10"`` -> its ten
    tasks; a comma list, ``"metaworld/drawer-open-v3,drawer-close-v3"`` -> those two. Every name is checked."""
    if not isinstance(spec, str) or spec.count("/") != 1:
        raise ValueError(
            f"name environments as family/task (or family/task1,task2, or a task set such as "
            f"metaworld/mt10); got {spec!r}"
        )
    family_name, tasks = spec.split("/")
    fam = family(family_name)
    names: list[str] = []
    for task in [t.strip() for t in tasks.split(",") if t.strip()]:
        expanded = fam.task_sets.get(task, (task,))
        names.extend(f"{family_name}/{t}" for t in expanded)
    if not names:
        raise ValueError(f"{spec!r} names no task; e.g. {family_name}/{fam.default_task}")
    for name in names:
        split_name(name)
    if len(set(names)) != len(names):
        raise ValueError(f"{spec!r} names a task twice: {names}")
    return names


def make_env(
    name: str,
    *,
    image_keys: list[str] | tuple[str, ...] = (),
    image_size: int | None = None,
    max_steps: int | None = None,
    **options: Any,
) -> Env:
    """The environment ``family/task``; it renders the cameras in ``image_keys`` at ``image_size`` pixels.
    ``options`` are the family's own (Meta-World: ``observation="privileged" | "lerobot"``)."""
    fam, task = split_name(name)
    return fam.make_env(task, image_keys=list(image_keys), image_size=image_size, max_steps=max_steps, **options)


def make_expert(name: str) -> Expert:
    """The scripted expert for ``family/task``."""
    fam, task = split_name(name)
    return fam.make_expert(task)


__all__ = [
    "EVAL_SEED_START",
    "FAMILIES",
    "checked_action",
    "TRAIN_SEED_START",
    "Env",
    "Expert",
    "Family",
    "env_names",
    "family",
    "make_env",
    "make_expert",
    "register",
    "split_name",
]
