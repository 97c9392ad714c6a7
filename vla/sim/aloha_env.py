"""ALOHA sim behind the simulator interface (``vla.sim``): two ViperX arms at a table, two bimanual tasks.

Family ``aloha``, tasks ``transfer-cube`` (the right arm picks up a cube and hands it to the left arm) and
``insertion`` (the right arm picks up a peg, the left arm a socket, and the peg goes into the socket), the
simulated tasks of ACT (Zhao et al., 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost Hardware").
The MJCF models and meshes are gym-aloha's (``gym_aloha/assets``, installed without its dependencies); everything
else is written here on the plain ``mujoco`` bindings: reset poses, physics stepping, gripper normalisation, reward.

    env = AlohaEnv("transfer-cube", image_keys=["observation.images.top"], image_size=128)
    obs = env.reset(seed)            # the object pose(s) drawn from a generator seeded by `seed`
    obs, reward, done, info = env.step(action)   # info: success, truncated

Observation (a dict with a dataset sample's keys, unbatched):
    "observation.state"        float32 [21] / [28]  the 14 joint positions (see JOINT_NAMES; the grippers normalised
                                                    to 0 = closed, 1 = open) then the object pose(s), xyz + quaternion
                                                    (wxyz): the cube, or the peg then the socket. Privileged, like
                                                    Meta-World's state: a real robot does not know the object poses.
                                                    With ``observation="proprio"``: the 14 joint positions only (ACT's
                                                    qpos), for policies that see the objects through a camera
    "observation.images.<cam>" float32 [3, H, W]    RGB in [0, 1] for each camera asked for (the model's cameras:
                                                    ``top``, ``angle``, ``left_wrist``, ...), square, ``image_size`` px
    "task"                     str                  the instruction, a plain sentence (TASK_TEXT)

Action: float [14], per arm (left, then right) 6 joint position targets (rad) and the gripper target normalised to
[0, 1] (0 closed, 1 open), as ACT's joint-space actions. Values outside these bounds are clipped and counted
(``clipped_steps``); within them the fingers reach only 0.065..0.975 of the normalised range (their joint limits,
ACT's calibration), so a gripper target beyond that is held at the limit by MuJoCo, not counted. One action lasts ``CONTROL_DT`` = 0.02 s (50 Hz: 10 physics steps of 2 ms); an episode is cut
at 400 actions (8 s).

Reward: the task's stage, 0..4, from the contacts (gym-aloha's definitions). transfer-cube: 1 the right fingers
touch the cube, 2 and the cube is off the table, 3 the left fingers touch it, 4 the left fingers touch it and it is
off the table (success). insertion: 1 both grippers touch their objects, 2 and both are off the table, 3 the peg
touches the socket with neither on the table, 4 the peg touches the pin inside the socket (success). An episode
succeeds (and ends) the first step the reward reaches 4.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lerobot.utils.constants import OBS_STATE

from vla.data.reader import IMAGE_PREFIX
from vla.names import check_name
from vla.sim import Episode, checked_max_steps, lerobot_features
from vla.sim.render import checked_cameras, fast_renderer

FPS = 50
CONTROL_DT = 1.0 / FPS  # seconds per action
DEFAULT_MAX_STEPS = 400  # ACT's episode length for both tasks (8 s)
DEFAULT_CAMERA = "top"
DEFAULT_IMAGE_SIZE = 128  # pixels (square) when cameras are asked for without a size
MAX_REWARD = 4  # the last stage of both tasks: success
OBSERVATIONS = ("privileged", "proprio")  # the state conventions (module docstring)

ARM_JOINTS = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate"]
JOINT_NAMES = [f"{side}_{j}" for side in ("left", "right") for j in [*ARM_JOINTS, "gripper"]]  # 14
ACTION_DIM = len(JOINT_NAMES)
# Each arm's 8 joints in the model: the 6 arm joints, then its two fingers (slides, the second mirroring the first).
START_ARM_POSE = np.array([0.0, -0.96, 1.16, 0.0, -0.3, 0.0, 0.02239, -0.02239] * 2)  # qpos[:16] at reset
# The first finger's opening (m) that the normalised gripper maps to 0 and 1 (the puppet gripper's range in ACT).
GRIPPER_CLOSED_M = 0.01844
GRIPPER_OPEN_M = 0.05800


def normalize_gripper(finger_m: Any) -> Any:
    """A finger's position (m) -> the normalised gripper (0 closed, 1 open)."""
    return (finger_m - GRIPPER_CLOSED_M) / (GRIPPER_OPEN_M - GRIPPER_CLOSED_M)


def unnormalize_gripper(value: Any) -> Any:
    """The normalised gripper -> the first finger's position target (m); the second finger mirrors it."""
    return GRIPPER_CLOSED_M + value * (GRIPPER_OPEN_M - GRIPPER_CLOSED_M)


@dataclass(frozen=True)
class Task:
    """One ALOHA task: its model files, its objects (free joints, in ``observation.state`` order) and their ranges."""

    text: str  # the instruction
    model: str  # gym-aloha's joint-space model
    ee_model: str  # the same scene with mocap bodies welded to the grippers, for the scripted expert
    objects: tuple[str, ...]  # the objects' names in the state ("cube"; "peg", "socket")
    joints: tuple[str, ...]  # their free joints in the model
    ranges: tuple[tuple[tuple[float, float], ...], ...]  # per object: (x, y, z) ranges (m) its position is drawn from


TASKS = {
    "transfer-cube": Task(
        text="pick up the cube with the right arm and hand it to the left arm",
        model="bimanual_viperx_transfer_cube.xml",
        ee_model="bimanual_viperx_end_effector_transfer_cube.xml",
        objects=("cube",),
        joints=("red_box_joint",),
        ranges=(((0.0, 0.2), (0.4, 0.6), (0.05, 0.05)),),
    ),
    "insertion": Task(
        text="insert the peg into the socket",
        model="bimanual_viperx_insertion.xml",
        ee_model="bimanual_viperx_end_effector_insertion.xml",
        objects=("peg", "socket"),
        joints=("red_peg_joint", "blue_socket_joint"),
        ranges=(((0.1, 0.2), (0.4, 0.6), (0.05, 0.05)), ((-0.2, -0.1), (0.4, 0.6), (0.05, 0.05))),
    ),
}
POSE_NAMES = ["x", "y", "z", "qw", "qx", "qy", "qz"]


def task_names() -> list[str]:
    return list(TASKS)


def state_names(task: str, observation: str = "privileged") -> list[str]:
    """``observation.state``'s names: the 14 joints, then (privileged) ``<object>_<x|y|z|qw|qx|qy|qz>`` per object."""
    if observation == "proprio":
        return list(JOINT_NAMES)
    return JOINT_NAMES + [f"{obj}_{c}" for obj in TASKS[task].objects for c in POSE_NAMES]


def sample_objects(task: str, seed: int) -> np.ndarray:
    """The object poses of episode ``seed``: float64 [7 * objects], xyz drawn uniformly in the task's ranges from a
    generator seeded by ``seed``, upright (quaternion 1, 0, 0, 0). The env and its expert both call this."""
    rng = np.random.default_rng(int(seed))
    poses = []
    for ranges in TASKS[task].ranges:
        low, high = np.array(ranges).T
        poses.append(np.concatenate([rng.uniform(low, high), [1.0, 0.0, 0.0, 0.0]]))
    return np.concatenate(poses)


def assets_dir() -> Path:
    """gym-aloha's model folder, found without importing its code (which needs dm-control and an older mujoco)."""
    spec = importlib.util.find_spec("gym_aloha")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "assets"
        if path.is_dir():
            return path
    raise RuntimeError(
        "the ALOHA models come from the gym-aloha package, which is not installed: run `make setup` "
        "(or `pip install --no-deps gym-aloha==0.1.5`; its own dependencies are not needed)"
    )


def load_model(task: str, end_effector: bool = False):
    """The task's ``mujoco.MjModel``: joint-space, or with the grippers welded to mocap bodies (``end_effector``)."""
    import mujoco

    spec = TASKS[task]
    model = mujoco.MjModel.from_xml_path(str(assets_dir() / (spec.ee_model if end_effector else spec.model)))
    if end_effector:
        # gym-aloha's weld impedance (solimp 0.25, 0.25) dates from MuJoCo 2: under MuJoCo 3 the grippers trail their
        # mocap targets by ~5 cm and the expert succeeds in no episode. A stiff one (0.95, 0.99) holds them to ~2 mm.
        model.eq_solimp[:, :3] = [0.95, 0.99, 0.001]
    assert abs(model.opt.timestep * round(CONTROL_DT / model.opt.timestep) - CONTROL_DT) < 1e-9
    return model


def object_qpos_slices(model, task: str) -> list[slice]:
    """Where each object's free-joint pose (7 values) sits in ``qpos``."""
    import mujoco

    slices = []
    for joint in TASKS[task].joints:
        adr = model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)]
        slices.append(slice(adr, adr + 7))
    return slices


def advance(model, data, nstep: int) -> None:
    """``nstep`` physics steps with ``data.ctrl`` as set, leaving positions, contacts and camera poses computed for the
    state reached (MuJoCo's ``mj_step2`` / ``mj_step1`` split: the first half-step of the next call happened here)."""
    import mujoco

    mujoco.mj_step2(model, data)  # acceleration and integration with the new controls (mj_step1 ran already)
    if nstep > 1:
        mujoco.mj_step(model, data, nstep - 1)
    mujoco.mj_step1(model, data)  # positions, contacts and velocities of the new state (what reward and render read)


class Stages:
    """The task's reward (its stage, 0..4) from the contacts in ``data``; names resolved to geom ids once."""

    def __init__(self, model, task: str):
        import mujoco

        def ids(*names: str) -> frozenset[int]:
            return frozenset(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, n) for n in names)

        self.task = task
        self.table = ids("table")
        self.left = ids("vx300s_left/10_left_gripper_finger")  # gym-aloha's definitions read one finger per gripper
        self.right = ids("vx300s_right/10_right_gripper_finger")
        if task == "transfer-cube":
            self.cube = ids("red_box")
        else:
            self.peg = ids("red_peg")
            self.socket = ids("socket-1", "socket-2", "socket-3", "socket-4")
            self.pin = ids("pin")

    def __call__(self, data) -> int:
        pairs = {tuple(sorted(p)) for p in data.contact.geom[: data.ncon].tolist()}

        def touch(a: frozenset[int], b: frozenset[int]) -> bool:
            return any((min(i, j), max(i, j)) in pairs for i in a for j in b)

        if self.task == "transfer-cube":
            right, left = touch(self.cube, self.right), touch(self.cube, self.left)
            on_table = touch(self.cube, self.table)
            if left:
                return 3 if on_table else 4  # attempted / done hand-over
            return (1 if on_table else 2) if right else 0  # touched / lifted by the right gripper
        if touch(self.peg, self.pin):
            return 4
        grounded = touch(self.peg, self.table) or touch(self.socket, self.table)
        if touch(self.peg, self.socket) and not grounded:
            return 3
        if touch(self.peg, self.right) and touch(self.socket, self.left):
            return 1 if grounded else 2
        return 0


def reset_scene(model, data, task: str, objects: np.ndarray) -> None:
    """Arms at ``START_ARM_POSE``, the objects at ``objects`` (float [7 * objects]), at rest; controls not touched."""
    import mujoco

    mujoco.mj_resetData(model, data)
    data.qpos[:16] = START_ARM_POSE
    for k, where in enumerate(object_qpos_slices(model, task)):
        data.qpos[where] = objects[7 * k : 7 * k + 7]


def joint_state(data) -> np.ndarray:
    """The 14 joint positions of the state: per arm its 6 joints and its normalised gripper, float64."""
    q = data.qpos
    return np.concatenate([q[0:6], [normalize_gripper(q[6])], q[8:14], [normalize_gripper(q[14])]])


class AlohaEnv(Episode):
    """One ALOHA task in joint space, reset per seed, rendering the cameras in ``image_keys`` (module docstring);
    ``observation`` is the state convention, ``"privileged"`` (joints and object poses) or ``"proprio"`` (joints).

    The ``vla.sim.Env`` interface: ``reset(seed) -> obs``; ``step(action) -> (obs, reward, done, info)`` where ``done``
    is success or the step limit and ``info`` has ``success`` and ``truncated`` (bools). Close it (or use ``with``)
    to release the renderer.
    """

    action_dim = ACTION_DIM
    fps = FPS
    robot_type = "aloha"

    def __init__(
        self,
        task: str,
        *,
        image_keys: list[str] | tuple[str, ...] = (),
        image_size: int | None = None,
        max_steps: int | None = None,
        observation: str = "privileged",
    ):
        import mujoco

        self.task = check_name("ALOHA task", task, task_names())
        self.observation = check_name("ALOHA observation convention", observation, OBSERVATIONS)
        self.name = f"aloha/{self.task}"
        self.task_text = TASKS[self.task].text
        self.max_steps = checked_max_steps(max_steps, DEFAULT_MAX_STEPS)
        self.image_keys, self.image_size = checked_cameras(image_keys, image_size, DEFAULT_IMAGE_SIZE, DEFAULT_CAMERA)

        self.model = load_model(self.task)
        self.data = mujoco.MjData(self.model)
        self._substeps = round(CONTROL_DT / self.model.opt.timestep)
        self._stages = Stages(self.model, self.task)
        self._objects = object_qpos_slices(self.model, self.task)
        self._state_names = state_names(self.task, self.observation)
        # Action bounds: the arm actuators' control ranges, and [0, 1] for the normalised grippers.
        arm = self.model.actuator_ctrlrange[[0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]]
        self.action_low = np.insert(arm[:, 0], [6, 12], 0.0)
        self.action_high = np.insert(arm[:, 1], [6, 12], 1.0)
        self._cameras = [k.removeprefix(IMAGE_PREFIX) for k in self.image_keys]
        self._renderer = self._make_renderer() if self.image_keys else None
        self.clipped_steps = 0  # actions of this episode with a value outside the bounds (clipped)
        self.last_frames: dict[str, np.ndarray] = {}  # camera key -> uint8 [H, W, 3] behind the latest observation

    @property
    def features(self) -> dict[str, dict]:
        """The LeRobot feature spec of the observations and actions (``vla.sim.lerobot_features``)."""
        return lerobot_features(self._state_names, JOINT_NAMES, self.image_keys, self.image_size)

    # -- the interface ---------------------------------------------------------------------------

    def reset(self, seed: int) -> dict[str, Any]:
        """Start an episode with the object pose(s) of ``seed`` (``sample_objects``); return the first observation."""
        import mujoco

        reset_scene(self.model, self.data, self.task, sample_objects(self.task, self.begin(seed)))
        self.data.ctrl[:] = START_ARM_POSE  # hold the start pose
        mujoco.mj_forward(self.model, self.data)
        self.clipped_steps = 0
        return self._observe()

    def step(self, action: np.ndarray, render: bool = True) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Apply one action (float [14], clipped to the bounds) for 0.02 s; return ``(obs, reward, done, info)``, the
        cameras drawn only when ``render``."""
        action = self.checked(action, ACTION_DIM, "ALOHA actions (6 joints + gripper per arm)")
        clipped = np.clip(action, self.action_low, self.action_high)
        self.clipped_steps += int(np.any(clipped != action))
        left, right = unnormalize_gripper(clipped[6]), unnormalize_gripper(clipped[13])
        self.data.ctrl[:] = np.concatenate([clipped[0:6], [left, -left], clipped[7:13], [right, -right]])
        advance(self.model, self.data, self._substeps)
        reward = self._stages(self.data)
        success = reward == MAX_REWARD
        done, truncated = self.end_step(success)
        return self._observe(render), float(reward), done, {"success": success, "truncated": truncated}

    # -- helpers ---------------------------------------------------------------------------------

    def render(self, key: str) -> np.ndarray:
        """Camera ``key``'s image now, uint8 [H, W, 3] (what the dataset stores)."""
        if self._renderer is None:
            raise RuntimeError("this env renders nothing: make it with image_keys=[...]")
        self._renderer.update_scene(self.data, camera=key.removeprefix(IMAGE_PREFIX))
        return self._renderer.render().copy()

    def _observe(self, render: bool = True) -> dict[str, Any]:
        objects = [self.data.qpos[where] for where in self._objects] if self.observation == "privileged" else []
        state = np.concatenate([joint_state(self.data), *objects]).astype(np.float32)
        return self.with_images({OBS_STATE: state, "task": self.task_text}, render)

    def _make_renderer(self):
        import mujoco

        model = self.model
        known = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
        for camera in self._cameras:
            check_name("ALOHA camera", camera, known)
        return fast_renderer(model, self.image_size, owner=self)
