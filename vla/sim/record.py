"""Record scripted-expert demonstrations from a simulator into a LeRobot v3.0 dataset, atomically.

    summary = record("push-v3", episodes=100, root="outputs/datasets/metaworld_push-v3")

Each attempt runs Meta-World's expert on a fresh seed (``seed, seed + 1, ...``); successful episodes are
kept (all of them with ``keep_failed=True``, each flagged in ``meta/recording.json``) until ``episodes``
are recorded. The dataset holds per step:

    observation.state            float32 [39]       (names in vla.sim.metaworld_env.STATE_NAMES)
    action                       float32 [4]        dx, dy, dz, gripper in [-1, 1]
    observation.images.<camera>  image [H, W, 3]    only with images=True (PNG frames, no video codec)
    task                         the task sentence

and ``meta/recording.json`` says how it was made: task, expert success rate, the seed of every episode,
the action noise, versions.

``action_noise=sigma`` perturbs the expert the DART way (Laskey et al., 2017): each action the env executes is the
expert's plus Gaussian noise (std ``sigma`` per dimension, clipped to [-1, 1]), while the dataset stores the
expert's own action for that state. The episodes then visit states just off the expert's path, labelled with how
the expert gets back, which is what a cloned policy needs once its own small errors move it there (a missed grasp,
an approach a centimetre off). The noise comes from a generator seeded by the episode's seed: a recording is
reproducible, episode by episode.

The dataset is written to a hidden sibling folder and renamed into place at the end, so a failed or
interrupted recording leaves no dataset that looks complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from vla.sim.metaworld_env import (
    ACTION_DIM,
    ACTION_NAMES,
    DEFAULT_CAMERA,
    DEFAULT_MAX_STEPS,
    EVAL_SEED_START,
    STATE_DIM,
    STATE_NAMES,
    TRAIN_SEED_START,
    ExpertPolicy,
    MetaWorldEnv,
    check_task,
)
from vla.sim.rollout import EpisodeResult, run_episode, summarize

DEFAULT_TASK = "push-v3"
DEFAULT_EPISODES = 100
DEFAULT_ACTION_NOISE = 0.0  # the default dataset's DART noise (see the module docstring)
DEFAULT_IMAGE_SIZE = 128
# The dataset `vla demo` trains on (relative to the working directory).
DEFAULT_DATASET_ROOT = Path("outputs/datasets/metaworld_push-v3")
RECORDING_FILE = "meta/recording.json"
RECORDING_FORMAT = 1


def default_root(task: str = DEFAULT_TASK, images: bool = False) -> Path:
    """Where ``vla data record`` writes when no ``--root`` is given."""
    return Path("outputs/datasets") / f"metaworld_{task}{'_images' if images else ''}"


def max_attempts_for(episodes: int) -> int:
    """How many seeds a recording may spend to collect ``episodes`` successes (experts succeed ~98%)."""
    return 3 * episodes + 10


def record(
    task: str = DEFAULT_TASK,
    episodes: int = DEFAULT_EPISODES,
    root: str | Path | None = None,
    *,
    images: bool = False,
    seed: int = TRAIN_SEED_START,
    image_size: int = DEFAULT_IMAGE_SIZE,
    camera: str = DEFAULT_CAMERA,
    max_steps: int = DEFAULT_MAX_STEPS,
    keep_failed: bool = False,
    action_noise: float = 0.0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Record ``episodes`` expert episodes of a Meta-World task into a new LeRobot dataset at ``root``.

    Returns a summary: ``root``, ``episodes``, ``attempts``, ``expert_success_rate``, ``frames``,
    ``episode_lengths``, ``seeds``, ``seconds``, ``steps_per_s`` and the settings. Raises ValueError for
    bad arguments (unknown task, existing root without ``overwrite``, seeds reaching the evaluation range)
    and when the expert cannot collect ``episodes`` successes within ``max_attempts_for(episodes)`` seeds.
    """
    task = check_task(task)
    root = Path(root) if root is not None else default_root(task, images)
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if not (np.isfinite(action_noise) and 0.0 <= action_noise <= 1.0):
        raise ValueError(f"action_noise is a standard deviation in action units, 0 to 1; got {action_noise}")
    attempts_allowed = episodes if keep_failed else max_attempts_for(episodes)
    if seed < 0 or seed + attempts_allowed > EVAL_SEED_START:
        raise ValueError(
            f"recording may use seeds {seed}..{seed + attempts_allowed - 1}, but seeds from "
            f"{EVAL_SEED_START} are kept for evaluation; choose a seed in 0..{EVAL_SEED_START - attempts_allowed}"
        )
    if root.exists() and not overwrite:
        raise ValueError(f"{root} already exists; choose another --root or pass --overwrite to replace it")
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} exists and is not a folder")

    # Write everything into a hidden sibling, rename on success: readers never see half a dataset.
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = root.parent / f".{root.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    try:
        summary = _record_into(
            partial,
            task=task,
            episodes=episodes,
            images=images,
            seed=seed,
            image_size=image_size,
            camera=camera,
            max_steps=max_steps,
            keep_failed=keep_failed,
            action_noise=float(action_noise),
            attempts_allowed=attempts_allowed,
            progress=progress,
        )
        _move_into_place(partial, root)
    except BaseException:  # also Ctrl-C: nothing half-written stays behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    summary["root"] = str(root)
    return summary


def _record_into(
    out: Path,
    *,
    task: str,
    episodes: int,
    images: bool,
    seed: int,
    image_size: int,
    camera: str,
    max_steps: int,
    keep_failed: bool,
    action_noise: float,
    attempts_allowed: int,
    progress: bool,
) -> dict[str, Any]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # slow import: only when recording
    from lerobot.utils.utils import SuppressProgressBars
    from tqdm import tqdm

    started = time.perf_counter()
    expert = NoisyExpert(ExpertPolicy(task), action_noise)
    kept: list[EpisodeResult] = []
    tried: list[EpisodeResult] = []
    # Unwound last-in first-out on success and on any error: bar, dataset (finalize writes the parquet
    # footers, needed even when the folder is about to be deleted), progress bars, env.
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(
            MetaWorldEnv(task, image_size=image_size if images else None, camera=camera, max_steps=max_steps)
        )
        stack.enter_context(SuppressProgressBars())  # the `datasets` library draws a bar per saved episode
        dataset = LeRobotDataset.create(
            repo_id=f"local/metaworld_{task}",
            fps=env.fps,
            features=_features(env, images, image_size),
            root=out,
            robot_type="sawyer",
            use_videos=False,
            video_backend="pyav",  # no videos here; naming one skips LeRobot's noisy torchcodec probe
            # PNGs are written in this thread: a writer thread measured no faster on 2 cores
        )
        stack.callback(dataset.finalize)
        bar = stack.enter_context(tqdm(total=episodes, desc=f"record {task}", unit="ep", disable=not progress))

        def add_frame(obs: dict[str, Any], action: np.ndarray) -> None:
            frame = {
                "observation.state": obs["observation.state"],  # float32 [39]
                "action": expert.label,  # float32 [4]: the expert's own action (the executed one when no noise)
                "task": obs["task"],
            }
            if images:
                frame[env.image_key] = env.last_frame  # uint8 [H, W, 3]
            dataset.add_frame(frame)

        for attempt_seed in range(seed, seed + attempts_allowed):
            if len(kept) == episodes:
                break
            expert.seed(attempt_seed)
            result = run_episode(env, expert, attempt_seed, on_step=add_frame)
            tried.append(result)
            if result.success or keep_failed:
                dataset.save_episode()
                kept.append(result)
                bar.update(1)
            else:
                dataset.clear_episode_buffer()
            bar.set_postfix(expert_success=f"{np.mean([r.success for r in tried]):.0%}")
    _remove_empty_dirs(out / "images")  # LeRobot's scratch folder for PNG frames, empty once embedded
    if len(kept) < episodes:
        raise ValueError(
            f"the {task} expert succeeded in only {len(kept)} of {len(tried)} attempts "
            f"(seeds {seed}..{seed + len(tried) - 1}); record fewer episodes or pass --keep-failed"
        )

    seconds = time.perf_counter() - started
    tried_stats = summarize(tried)
    summary = {
        "env": "metaworld",
        "task": task,
        "task_text": env.task_text,
        "episodes": len(kept),
        "frames": int(sum(r.length for r in kept)),
        "attempts": len(tried),
        "expert_success_rate": tried_stats["success_rate"],
        "episode_lengths": [r.length for r in kept],
        "episode_success": [r.success for r in kept],
        "seeds": [r.seed for r in kept],
        "failed_seeds": [r.seed for r in tried if not r.success],
        "seed_start": seed,
        "keep_failed": keep_failed,
        "action_noise": action_noise,
        "images": images,
        "image_size": image_size if images else None,
        "camera": camera if images else None,
        "fps": env.fps,
        "max_steps": max_steps,
        "seconds": round(seconds, 3),
        "steps_per_s": round(sum(r.length for r in tried) / max(seconds, 1e-9), 1),
    }
    _write_recording_json(out, summary)
    return summary


class NoisyExpert:
    """An expert whose executed actions carry Gaussian noise (DART); ``label`` is its clean action for the last
    observation, the one a dataset should store. With ``sigma=0`` it is the expert itself."""

    def __init__(self, expert: ExpertPolicy, sigma: float):
        self.expert, self.sigma = expert, float(sigma)
        self.rng = np.random.default_rng(0)
        self.label = np.zeros(ACTION_DIM, dtype=np.float32)

    def seed(self, seed: int) -> None:
        """Noise for the episode on ``seed``: its own stream, so each episode reproduces on its own."""
        self.rng = np.random.default_rng([int(seed), 0xDA27])

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        clean = self.expert(obs)  # float32 [1, 4], clipped
        self.label = clean[0].copy()
        if self.sigma == 0.0:
            return clean
        return np.clip(clean + self.rng.normal(0.0, self.sigma, clean.shape), -1.0, 1.0).astype(np.float32)

    def reset(self) -> None:
        self.expert.reset()


def _features(env: MetaWorldEnv, images: bool, image_size: int) -> dict[str, dict]:
    """The LeRobot feature spec of a recording."""
    features: dict[str, dict] = {
        "observation.state": {"dtype": "float32", "shape": (STATE_DIM,), "names": STATE_NAMES},
        "action": {"dtype": "float32", "shape": (ACTION_DIM,), "names": ACTION_NAMES},
    }
    if images:
        features[env.image_key] = {
            "dtype": "image",  # PNG frames inside the parquet files: exact pixels, no video codec involved
            "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
    return features


def _write_recording_json(out: Path, summary: dict[str, Any]) -> None:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("metaworld", "mujoco", "lerobot"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    content = {"format": RECORDING_FORMAT, **summary, "versions": versions}
    content.pop("seconds", None)  # machine-dependent: keep the file reproducible
    content.pop("steps_per_s", None)
    (out / RECORDING_FILE).write_text(json.dumps(content, indent=2) + "\n")


def _remove_empty_dirs(folder: Path) -> None:
    if not folder.is_dir():
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def _move_into_place(partial: Path, root: Path) -> None:
    """Rename the finished dataset to ``root``; an existing ``root`` (overwrite) goes only after that."""
    if not root.exists():
        os.replace(partial, root)
        return
    old = root.parent / f".{root.name}.old-{os.getpid()}"
    os.replace(root, old)
    os.replace(partial, root)
    shutil.rmtree(old, ignore_errors=True)


def ensure_dataset(
    root: str | Path = DEFAULT_DATASET_ROOT,
    task: str = DEFAULT_TASK,
    episodes: int = DEFAULT_EPISODES,
    *,
    action_noise: float = DEFAULT_ACTION_NOISE,
    progress: bool = True,
    log=print,
) -> Path:
    """A recorded dataset at ``root`` made with these settings: the one there, else a new recording.

    A folder that ``record`` made with other settings (task, episode count, action noise: say an older default)
    is recorded again in its place; a dataset without ``meta/recording.json`` (not ours) is used as it is.
    """
    root = Path(root)
    wanted = {"task": check_task(task), "episodes": int(episodes), "action_noise": float(action_noise)}
    if (root / "meta" / "info.json").is_file():
        recording_path = root / RECORDING_FILE
        if not recording_path.is_file():
            return root
        recorded = json.loads(recording_path.read_text())
        have = {"task": recorded.get("task"), "episodes": recorded.get("episodes"),
                "action_noise": float(recorded.get("action_noise", 0.0))}  # fmt: skip
        if have == wanted:
            return root
        changed = ", ".join(f"{k} {have[k]} -> {wanted[k]}" for k in wanted if have[k] != wanted[k])
        log(f"{root} was recorded with other settings ({changed}); recording it again")
    else:
        log(f"recording {episodes} {task} expert episodes into {root}")
    record(task, episodes, root, action_noise=action_noise, overwrite=True, progress=progress)
    return root

