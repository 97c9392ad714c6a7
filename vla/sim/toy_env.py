"""A 2-D toy behind the simulator interface (``vla.sim``): a point robot goes around a disc to a goal above it.

Family ``toy``, task ``obstacle``. It exists to show why a VLA predicts tokens with cross-entropy rather than
regressing actions (``scripts/multimodal.py``): its scripted expert goes around the obstacle on the LEFT or on the
RIGHT, 50/50 per episode, from the same start, so the demonstrations hold two right answers for one observation.

    env = make_env("toy/obstacle")
    obs = env.reset(seed)            # {"observation.state": float32 [2] = the position (x, y), "task": str}
    obs, reward, done, info = env.step(action)   # action: a velocity, float [2] in [-1, 1]

The arena is the square [-1, 1]^2; the obstacle a disc of radius ``OBSTACLE_RADIUS`` at the origin, the goal fixed at
``GOAL`` straight above it. Each seed draws the start within ``JITTER`` of ``START`` (straight below the disc), so
every start state is (nearly) the same and the state (the position alone: nothing in it tells an episode apart)
holds no hint of the side the expert will take. One action moves the robot by ``STEP`` times the velocity (clipped
to [-1, 1] per axis; the arena's border stops it). An episode ends:

* as a success when the robot is within ``GOAL_RADIUS`` of the goal (reward +1);
* as a failure when the segment it moved along touches the disc: a collision ends the episode (reward -1, the
  robot stays where it touched, ``info["collision"]``);
* at ``max_steps`` (reward 0: a stall, ``info["truncated"]``).

So an episode's return says how it ended: +1 success, -1 collision, 0 stall. No cameras: ``last_frames`` stays empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.names import check_name
from vla.sim import Episode, Family, checked_max_steps, register

TASKS = ("obstacle",)
TASK_TEXT = "go around the obstacle to the goal"
STATE_NAMES = ["x", "y"]
ACTION_NAMES = ["vx", "vy"]
ACTION_DIM = 2
FPS = 10
STEP = 0.05  # arena units moved per action at velocity 1 (per axis)
DEFAULT_MAX_STEPS = 80  # the expert needs about 34
OBSTACLE_CENTER = (0.0, 0.0)
OBSTACLE_RADIUS = 0.3
GOAL_RADIUS = 0.08
START = (0.0, -0.75)
GOAL = (0.0, 0.75)
JITTER = 0.03  # the start x, y are drawn uniformly within +- this of START
# The expert's waypoints beside the disc, for side = -1 (left) or +1 (right): (side * x, y).
WAYPOINTS = ((0.5, -0.3), (0.5, 0.3))
SIDES = {-1: "left", 1: "right"}


def segment_hits_disc(a: np.ndarray, b: np.ndarray, center=OBSTACLE_CENTER, radius=OBSTACLE_RADIUS) -> float | None:
    """Where along the segment a -> b (a fraction in [0, 1]) it first enters the disc, or None if it never does."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, center))
    d, f = b - a, a - c
    # |f + t d|^2 = r^2: a quadratic in t; the smaller root is the entry point.
    qa, qb, qc = d @ d, 2 * f @ d, f @ f - radius**2
    if qc <= 0:
        return 0.0  # a starts inside (touching) the disc
    if qa == 0:
        return None
    disc = qb * qb - 4 * qa * qc
    if disc < 0:
        return None
    t = (-qb - np.sqrt(disc)) / (2 * qa)
    return float(t) if 0.0 <= t <= 1.0 else None


def side_of(positions: np.ndarray, center=OBSTACLE_CENTER) -> str:
    """Which way a trajectory (positions [N, 2]) went around the disc: "left" or "right" by the sign of x where it
    first reaches the disc's height, "none" if it never did (it hit the disc, or stalled below it)."""
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 2)
    above = np.flatnonzero(positions[:, 1] >= center[1])
    if len(above) == 0:
        return "none"
    return "left" if positions[above[0], 0] < center[0] else "right"


class ToyObstacleEnv(Episode):
    """The ``toy/obstacle`` task (module docstring): the ``vla.sim.Env`` interface, state only."""

    action_dim = ACTION_DIM
    robot_type = "point2d"
    fps = FPS

    def __init__(
        self, task: str = "obstacle", *, image_keys=(), image_size: int | None = None, max_steps: int | None = None
    ):
        self.task = check_name("toy task", task, TASKS)
        if list(image_keys):
            raise ValueError(
                f"toy/{self.task} is state only and renders no camera; drop the cameras (got {list(image_keys)})"
            )
        self.name = f"toy/{self.task}"
        self.task_text = TASK_TEXT
        self.max_steps = checked_max_steps(max_steps, DEFAULT_MAX_STEPS)
        self.features: dict[str, dict] = {
            OBS_STATE: {"dtype": "float32", "shape": (len(STATE_NAMES),), "names": STATE_NAMES},
            ACTION: {"dtype": "float32", "shape": (ACTION_DIM,), "names": ACTION_NAMES},
        }
        self.last_frames: dict[str, Any] = {}  # no cameras
        self.position = np.zeros(2)
        self.goal = np.asarray(GOAL, dtype=np.float64)

    def reset(self, seed: int) -> dict[str, Any]:
        """Start an episode from the start of ``seed``; return the first observation."""
        rng = np.random.default_rng([self.begin(seed), 0x70E])
        self.position = np.asarray(START) + rng.uniform(-JITTER, JITTER, 2)
        return self._observe()

    def hold_action(self, last: Any) -> np.ndarray:
        """Holding still: zero velocity."""
        return np.zeros(ACTION_DIM)

    def step(self, action: Any, render: bool = True) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Move by ``STEP * clip(action)``; return ``(obs, reward, done, info)`` (info: success, collision, truncated)."""
        action = self.checked(action, ACTION_DIM, "toy actions (a velocity)")
        start = self.position
        end = np.clip(start + STEP * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        hit = segment_hits_disc(start, end)
        collision = hit is not None
        self.position = start + hit * (end - start) if collision else end
        success = not collision and bool(np.linalg.norm(self.position - self.goal) <= GOAL_RADIUS)
        done, truncated = self.end_step(success, failed=collision)
        reward = 1.0 if success else -1.0 if collision else 0.0
        return self._observe(), reward, done, {"success": success, "collision": collision, "truncated": truncated}

    def _observe(self) -> dict[str, Any]:
        return {OBS_STATE: self.position.astype(np.float32), "task": self.task_text}


class ToyObstacleExpert:
    """Goes around the disc on one side, chosen per episode by its seed (left or right, 50/50), through two waypoints
    beside the disc and then to the goal, at full speed along the straight line to each (``vla.sim.Expert``)."""

    def __init__(self, task: str = "obstacle"):
        check_name("toy task", task, TASKS)
        self.side = 1
        self._next = 0

    def reset(self, seed: int) -> None:
        self.side = 1 if np.random.default_rng([int(seed), 0x51DE]).random() < 0.5 else -1
        self._next = 0  # index of the next waypoint; len(WAYPOINTS) = the goal

    @property
    def side_name(self) -> str:
        return SIDES[self.side]

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        position = np.asarray(obs[OBS_STATE], dtype=np.float64)[:2]
        targets = [np.array([self.side * x, y]) for x, y in WAYPOINTS] + [np.asarray(GOAL)]
        while self._next < len(WAYPOINTS) and np.abs(targets[self._next] - position).max() < 1e-6:
            self._next += 1
        delta = targets[self._next] - position
        # The dominant axis at full speed, straight at the target; the last step lands on it.
        velocity = delta / max(np.abs(delta).max(), STEP)
        return velocity[None].astype(np.float32)  # [1, 2]


register(
    Family(
        name="toy",
        tasks=lambda: list(TASKS),
        make_env=ToyObstacleEnv,
        make_expert=ToyObstacleExpert,
        default_task="obstacle",
        default_cameras=(),
    )
)
