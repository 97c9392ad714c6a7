"""Meta-World behind the simulator interface (``vla.sim``): one MT1 task per env, and its scripted expert.

The observation is a dict with the keys of a dataset sample (``vla.data.reader``), unbatched. Two conventions
(``observation=``):

``"privileged"`` (the default: what the README's policies are trained on)
    "observation.state"            float32 [39]       Meta-World's goal-observable observation (see STATE_NAMES)
    "observation.images.<camera>"  float32 [3, H, W]  RGB in [0, 1], for each camera asked for (``image_keys``)
    "task"                         str                a short sentence, e.g. "push the puck to a goal"

``"proprio"`` (what a camera policy may see: the robot's own body, no object or goal poses)
    "observation.state"            float32 [4]        the hand's xyz and the gripper opening (LeRobot's ``agent_pos``)
    "observation.images.<camera>"  float32 [3, H, W]  the cameras asked for, rendered as for ``"privileged"``
    "task"                         str                as for ``"privileged"``
    "expert_state"                 float32 [39]       the full observation, for the scripted expert only

``"lerobot"`` (exactly what LeRobot's own Meta-World env, ``lerobot/envs/metaworld.py``, gives a policy under
``lerobot-eval --env.type=metaworld``, so a policy trained on such a recording is scored by LeRobot's evaluator)
    "observation.state"            float32 [4]        ``agent_pos``: the first four values (hand xyz, gripper)
    "observation.image"            float32 [3, 480, 480]  the ``corner2`` camera where LeRobot moves it, flipped
                                                      on both axes, at Meta-World's own render quality
    "task"                         str                LeRobot's sentence as it is, e.g. "Push the puck to a goal"
    "expert_state"                 float32 [39]       the full observation, for the scripted expert only (never
                                                      recorded, never seen by a policy)

so a policy sees the same types in the simulator as in training. Rendering LeRobot's image costs 0.5-1 s a frame on
a CPU (software GL); the privileged cameras skip anti-aliasing, shadows and reflections and cost ~10 ms at 128 px.
Actions are float [4]: the hand's xyz displacement and the gripper effort, each in [-1, 1] (Meta-World clips; so do
we, before recording).

Layouts: Meta-World's ``reset(seed=...)`` ignores the seed and MT1 holds only 50 fixed layouts, so the
wrapper draws each layout from the env's own generator, seeded per episode (``reset(seed)``): every
seed gives one reproducible layout, and distinct seeds give distinct layouts.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from lerobot.utils.constants import OBS_IMAGE, OBS_STATE

from vla.data.reader import IMAGE_PREFIX
from vla.names import check_name
from vla.sim import OBSERVATIONS, Episode, Family, checked_max_steps, lerobot_features, register
from vla.sim.render import checked_cameras, close_at_exit, fast_renderer, offscreen_error

ACTION_DIM = 4
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
# Meta-World's 39 observation values: this frame's 18, the previous frame's 18 (a velocity cue), the goal.
_FRAME_NAMES = (
    ["hand_x", "hand_y", "hand_z", "gripper_opening"]
    + [f"obj0_{c}" for c in ("x", "y", "z", "qw", "qx", "qy", "qz")]
    + [f"obj1_{c}" for c in ("x", "y", "z", "qw", "qx", "qy", "qz")]  # zeros for one-object tasks
)
STATE_NAMES = _FRAME_NAMES + [f"prev_{n}" for n in _FRAME_NAMES] + ["goal_x", "goal_y", "goal_z"]
STATE_DIM = len(STATE_NAMES)  # 39

DEFAULT_CAMERA = "corner2"
DEFAULT_IMAGE_SIZE = 128  # pixels (square) when cameras are asked for without a size
DEFAULT_MAX_STEPS = 500  # Meta-World's own episode limit (max_path_length)
# These cameras are mounted upside down in Meta-World's scene: rotate their images by 180 degrees.
_UPSIDE_DOWN_CAMERAS = {"corner", "corner2", "corner3"}
# corner2 frames the whole room, so at 128 px the puck is a few pixels: move it this many metres forward
# along its own line of sight (same direction, closer) so the table fills the frame.
_CAMERA_DOLLY_M = {"corner2": 0.4}
# Cameras of ours (MuJoCo free cameras, not in Meta-World's scene): "workspace" looks down at 45 degrees from beyond
# the goal towards the robot, framing the table's work area (x -0.25..0.25, y 0.55..0.95), so that at 64 px the
# puck is ~4 px and the goal ~3 px (in corner2's frame they are 1-2 px). (lookat xyz, distance m, azimuth, elevation)
_FREE_CAMERAS = {"workspace": ((0.0, 0.75, 0.05), 0.75, -90.0, -45.0)}

PROPRIO_DIM = 4  # hand xyz and gripper opening: the first four of the 39 values (LeRobot's agent_pos)
EXPERT_STATE = "expert_state"  # the full observation beside a partial one, read by ExpertPolicy only
# LeRobot's Meta-World env (lerobot/envs/metaworld.py, lerobot 0.6): agent_pos = the first four values, one camera
# "corner2" at 480 x 480 moved to this position, flipped on both axes, as "observation.image".
PROPRIO_STATE_NAMES = STATE_NAMES[:PROPRIO_DIM]  # also LeRobot's agent_pos
LEROBOT_CAMERA = "corner2"
LEROBOT_CAMERA_POS = (0.75, 0.075, 0.7)
LEROBOT_IMAGE_SIZE = 480


# Meta-World's MT10 benchmark (Yu et al., 2019): ten tasks, some of them pairs that start from alike scenes
# (drawer-open / drawer-close, window-open / window-close) and differ only in what the instruction asks.
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
TASK_SETS = {"mt10": MT10}


def task_names() -> list[str]:
    """Every Meta-World v3 task name, e.g. ``["assembly-v3", ..., "window-close-v3"]``."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return list(ALL_V3_ENVIRONMENTS)


_TASK_TEXT: dict[str, str] | None = None


def task_text(task: str) -> str:
    """A short sentence for the task, e.g. ``push-v3`` -> ``"push the puck to a goal"``.

    The sentences are the ones LeRobot ships for Meta-World (``lerobot/envs/metaworld_config.json``, read
    as data: importing ``lerobot.envs`` costs seconds), lower-cased; unknown tasks fall back to the name
    with ``-`` turned into spaces and the version dropped.
    """
    text = lerobot_task_text(task)
    if text:
        return text[0].lower() + text[1:]
    base = task[: -len("-v3")] if task.endswith("-v3") else task
    return base.replace("-", " ")


def lerobot_task_text(task: str) -> str | None:
    """LeRobot's sentence for the task as it ships it (``"Push the puck to a goal"``), or None if it has none."""
    global _TASK_TEXT
    if _TASK_TEXT is None:
        _TASK_TEXT = _load_lerobot_task_text()
    return _TASK_TEXT.get(task) or None


def _load_lerobot_task_text() -> dict[str, str]:
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.find_spec("lerobot")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "envs" / "metaworld_config.json"
        if path.is_file():
            try:
                return dict(json.loads(path.read_text()).get("TASK_DESCRIPTIONS", {}))
            except (OSError, ValueError):
                break
    return {}


class MetaWorldEnv(Episode):
    """One Meta-World MT1 task (goal observable), reset per seed, rendering the cameras in ``image_keys``.

    The ``vla.sim.Env`` interface: ``reset(seed) -> obs``; ``step(action) -> (obs, reward, done, info)`` where
    ``done`` is success or the step limit, and ``info`` has ``success`` (bool) and ``truncated`` (bool). Close it
    (or use ``with``) to release the renderer.

    ``observation="lerobot"`` gives LeRobot's convention (module docstring): its one camera is asked for with
    ``image_keys=["observation.image"]`` (or the family's default camera key, ``observation.images.corner2``, which
    names the same camera), at LeRobot's 480 px (``image_size`` unset or 480).
    """

    action_dim = ACTION_DIM
    robot_type = "sawyer"

    def __init__(
        self,
        task: str,
        *,
        image_keys: list[str] | tuple[str, ...] = (),
        image_size: int | None = None,
        max_steps: int | None = None,
        observation: str = "privileged",
    ):
        self.task = check_name("Meta-World task", task, task_names())
        self.observation = check_name("observation convention", observation, OBSERVATIONS)
        self.lerobot = self.observation == "lerobot"
        self.name = f"metaworld/{self.task}"
        self.task_text = (self.lerobot and lerobot_task_text(self.task)) or task_text(self.task)
        self.max_steps = checked_max_steps(max_steps, DEFAULT_MAX_STEPS)
        if self.lerobot:
            image_keys, image_size = _lerobot_camera(list(image_keys), image_size)
        self.image_keys, self.image_size = checked_cameras(
            image_keys, image_size, DEFAULT_IMAGE_SIZE, DEFAULT_CAMERA, other_keys=(OBS_IMAGE,) if self.lerobot else ()
        )

        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE

        cls = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{self.task}-goal-observable"]
        try:
            self._env = cls()
        except ValueError as err:
            if "broadcast" in str(err):  # metaworld 3.0.0 writes 11 weld parameters; mujoco >= 3.17 wants 12
                import mujoco

                raise RuntimeError(
                    f"Meta-World 3.0.0 does not run on mujoco {mujoco.__version__}: install mujoco<3.17 "
                    "(pip install 'mujoco>=3.8,<3.17')"
                ) from err
            raise
        # Draw each layout from env.np_random (seeded in reset) instead of the frozen MT1 layout.
        self._env._freeze_rand_vec = False
        self._env.seeded_rand_vec = True
        self._env.max_path_length = self.max_steps  # Meta-World raises past its own limit
        self.fps = int(round(1.0 / self._env.dt))  # 80 Hz: 5 physics steps of 2.5 ms per action

        self._renderer = None
        if self.image_keys and self.lerobot:
            self._renderer = self._make_lerobot_renderer()
        elif self.image_keys:
            self._renderer = self._make_renderer(
                self.image_size, [k.removeprefix(IMAGE_PREFIX) for k in self.image_keys]
            )
        self.last_frames: dict[str, np.ndarray] = {}  # camera key -> uint8 [H, W, 3] behind the latest observation

    @property
    def features(self) -> dict[str, dict]:
        """The LeRobot feature spec of the observations and actions (``vla.sim.lerobot_features``)."""
        state_names = STATE_NAMES if self.observation == "privileged" else PROPRIO_STATE_NAMES
        return lerobot_features(state_names, ACTION_NAMES, self.image_keys, self.image_size)

    # -- the interface ---------------------------------------------------------------------------

    def reset(self, seed: int) -> dict[str, Any]:
        """Start an episode on the layout of ``seed``; return the first observation."""
        self._env.seed(self.begin(seed))  # the layout comes from env.np_random (seeded_rand_vec above)
        raw, _ = self._env.reset()
        return self._observe(raw)

    def hold_action(self, last: np.ndarray) -> np.ndarray:
        """Holding still: no displacement, the gripper's last effort kept (an open or closed hand stays so)."""
        return np.concatenate([np.zeros(3), np.asarray(last, dtype=np.float64)[3:]])

    def step(self, action: np.ndarray, render: bool = True) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Apply one action (float [4], clipped to [-1, 1]); return ``(obs, reward, done, info)``, the cameras drawn
        only when ``render``."""
        action = self.checked(action, ACTION_DIM, "Meta-World actions")
        raw, reward, _, cut, info = self._env.step(np.clip(action, -1.0, 1.0))
        success = bool(info.get("success", 0.0))
        done, truncated = self.end_step(success, cut=bool(cut))
        return self._observe(raw, render), float(reward), done, {"success": success, "truncated": truncated}

    def close(self) -> None:
        super().close()
        self._env.close()

    # -- helpers ---------------------------------------------------------------------------------

    def render(self, key: str) -> np.ndarray:
        """Camera ``key``'s image now, uint8 [H, W, 3] (what the dataset stores)."""
        if self._renderer is None:
            raise RuntimeError("this env renders nothing: make it with image_keys=[...]")
        if self.lerobot:  # one camera, rendered as LeRobot's env renders it (Meta-World's own renderer)
            camera = LEROBOT_CAMERA
            image = self._renderer.render("rgb_array")  # uint8 [H, W, 3]
        else:
            camera = key.removeprefix(IMAGE_PREFIX)
            self._renderer.update_scene(self._env.data, camera=self._cameras[camera])
            image = self._renderer.render()  # uint8 [H, W, 3]
        if camera in _UPSIDE_DOWN_CAMERAS:
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)

    def _observe(self, raw: np.ndarray, render: bool = True) -> dict[str, Any]:
        obs: dict[str, Any] = {OBS_STATE: raw.astype(np.float32), "task": self.task_text}
        if self.observation != "privileged":  # agent_pos; the expert still reads the whole observation
            obs = {
                OBS_STATE: raw[:PROPRIO_DIM].astype(np.float32),
                "task": self.task_text,
                EXPERT_STATE: raw.astype(np.float32),
            }
        return self.with_images(obs, render)

    def _make_lerobot_renderer(self):
        """Meta-World's own renderer (gymnasium's ``MujocoRenderer``) on LeRobot's camera and at LeRobot's position,
        with the model's own render quality: the pixels LeRobot's env gives."""
        import mujoco
        from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

        model = self._env.model
        model.cam_pos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, LEROBOT_CAMERA)] = LEROBOT_CAMERA_POS
        size = self.image_size
        renderer = MujocoRenderer(model, self._env.data, None, size, size, camera_name=LEROBOT_CAMERA)
        try:
            renderer.render("rgb_array")  # makes the GL context now, so a missing GL library fails here
        except Exception as err:
            raise offscreen_error(err) from err
        close_at_exit(self)
        return renderer

    def _make_renderer(self, size: int, cameras: list[str]):
        import mujoco

        model = self._env.model
        known = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
        self._cameras: dict[str, Any] = {}  # camera name -> what update_scene takes (a scene camera's name, or ours)
        for camera in cameras:
            check_name("camera", camera, known + list(_FREE_CAMERAS))
            if camera in _FREE_CAMERAS:
                lookat, distance, azimuth, elevation = _FREE_CAMERAS[camera]
                free = self._cameras[camera] = mujoco.MjvCamera()
                free.type = mujoco.mjtCamera.mjCAMERA_FREE
                free.lookat[:], free.distance, free.azimuth, free.elevation = lookat, distance, azimuth, elevation
                continue
            self._cameras[camera] = camera
            cam_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            dolly = _CAMERA_DOLLY_M.get(camera, 0.0)
            if dolly:
                rot = np.zeros(9)
                mujoco.mju_quat2Mat(rot, model.cam_quat[cam_id])
                forward = -rot.reshape(3, 3)[:, 2]  # a MuJoCo camera looks along its -z axis
                model.cam_pos[cam_id] = model.cam_pos[cam_id] + dolly * forward
        mujoco.mj_forward(model, self._env.data)
        return fast_renderer(model, size, owner=self)


def _lerobot_camera(image_keys: list[str], image_size: int | None) -> tuple[list[str], int | None]:
    """The cameras of ``observation="lerobot"``: none, or LeRobot's one (``observation.image``, at 480 px)."""
    if not image_keys:
        return [], image_size
    if len(image_keys) > 1 or image_keys[0] not in (OBS_IMAGE, IMAGE_PREFIX + LEROBOT_CAMERA):
        raise ValueError(
            f"observation='lerobot' has LeRobot's one camera, {LEROBOT_CAMERA} as '{OBS_IMAGE}'; got {image_keys}. "
            f"Ask for ['{OBS_IMAGE}'] (or no camera), or use observation='privileged' for other cameras"
        )
    if image_size not in (None, LEROBOT_IMAGE_SIZE):
        raise ValueError(
            f"observation='lerobot' renders LeRobot's {LEROBOT_IMAGE_SIZE} x {LEROBOT_IMAGE_SIZE} image (the policy "
            f"resizes it); got image_size={image_size}: leave it unset or pass {LEROBOT_IMAGE_SIZE}"
        )
    return [OBS_IMAGE], LEROBOT_IMAGE_SIZE


class ExpertPolicy:
    """Meta-World's scripted expert for ``task`` as a chunk policy: ``obs -> actions float32 [1, 4]``.

    It reads only ``obs["observation.state"]`` (the float32 state a dataset stores), so recording and
    rollouts that feed it the same observations take the same actions. Actions are clipped to [-1, 1],
    as Meta-World applies them.
    """

    def __init__(self, task: str):
        from metaworld.policies import ENV_POLICY_MAP

        self.task = check_name("Meta-World task", task, task_names())
        if self.task not in ENV_POLICY_MAP:
            raise ValueError(f"Meta-World has no scripted expert for {self.task!r}")
        self._expert = ENV_POLICY_MAP[self.task]()

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        state = np.asarray(obs.get(EXPERT_STATE, obs[OBS_STATE]), dtype=np.float64)  # the whole observation
        with warnings.catch_warnings():
            # The experts' P-controllers routinely ask for more than the [-1, 1] the env allows and warn
            # each time; the clip below is the intended behaviour.
            warnings.simplefilter("ignore")
            action = self._expert.get_action(state)
        return np.clip(action, -1.0, 1.0).astype(np.float32)[None]  # [1, 4]

    def reset(self, seed: int | None = None) -> None:
        """The experts are memoryless; present for the ``vla.sim.Expert`` protocol."""


register(
    Family(
        name="metaworld",
        tasks=task_names,
        make_env=MetaWorldEnv,
        make_expert=ExpertPolicy,
        default_task="push-v3",
        default_cameras=(IMAGE_PREFIX + DEFAULT_CAMERA,),
        task_sets=TASK_SETS,
    )
)
