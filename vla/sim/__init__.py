"""Simulators, scripted experts, recording demonstrations into LeRobot datasets, closed-loop rollouts.

    from vla.sim import EVAL_SEED_START, ExpertPolicy, make_env, record, rollout

    env = make_env("push-v3", image_size=128)       # Meta-World MT1 task, goal observable
    obs = env.reset(seed=EVAL_SEED_START)            # dict with the keys of a dataset sample
    obs, reward, done, info = env.step(action)       # action: float [4]; info["success"]: bool

    record.record("push-v3", 100, "outputs/datasets/metaworld_push-v3")          # successful expert episodes
    rollout.rollout(ExpertPolicy("push-v3"), "push-v3", episodes=20)            # success rate, return, length

``record`` and ``rollout`` here are the modules (``vla.sim.record.record`` is the function, beside
``DEFAULT_DATASET_ROOT`` and friends): re-exporting the functions under the modules' names would make
``from vla.sim import record`` mean one thing or the other depending on import order.

Seeds: training recordings draw layouts from seeds ``TRAIN_SEED_START`` upward, evaluation from
``EVAL_SEED_START`` upward; ``record`` refuses seeds that would reach the evaluation range.
"""

import os

# MuJoCo picks its GL backend when it is first imported: choose headless EGL before anything imports it.
# A user's own MUJOCO_GL (osmesa, glfw) wins.
os.environ.setdefault("MUJOCO_GL", "egl")

from vla.sim import record, rollout  # noqa: E402  (the modules)
from vla.sim.metaworld_env import (  # noqa: E402
    EVAL_SEED_START,
    TRAIN_SEED_START,
    ExpertPolicy,
    MetaWorldEnv,
    check_task,
    make_env,
    task_names,
    task_text,
)
from vla.sim.record import (  # noqa: E402
    DEFAULT_DATASET_ROOT,
    DEFAULT_EPISODES,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_TASK,
    default_root,
    ensure_dataset,
)
from vla.sim.rollout import EpisodeResult, run_episode, run_episodes, summarize  # noqa: E402

__all__ = [
    "DEFAULT_DATASET_ROOT",
    "DEFAULT_EPISODES",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_TASK",
    "EVAL_SEED_START",
    "TRAIN_SEED_START",
    "EpisodeResult",
    "ExpertPolicy",
    "MetaWorldEnv",
    "check_task",
    "default_root",
    "ensure_dataset",
    "make_env",
    "record",
    "rollout",
    "run_episode",
    "run_episodes",
    "summarize",
    "task_names",
    "task_text",
]
